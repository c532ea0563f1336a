"""A stand-in for `nvidia-cuda-mps-control`, which cannot run without an NVIDIA GPU.

It keeps the real tool's contract as Parley uses it: `-d` starts a daemon for the pipe
directory in CUDA_MPS_PIPE_DIRECTORY (it returns once the daemon runs, its pid in the
directory's `nvidia-cuda-mps-control.pid`); `quit` on standard input asks that daemon to stop
and returns before it has (it takes a moment, as the real one stopping its servers does), and
with no daemon there the command fails as the real one does. FAKE_MPS_REFUSE set: `-d` fails, as the
real tool does where MPS is not permitted. `install(directory)` writes an executable of the
real tool's name into `directory` for PATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

NAME = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
WAIT_S = 5.0
STOPPING_S = 0.3


def install(directory: Path) -> Path:
    tool = directory / NAME
    tool.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({__file__!r}, run_name='__main__')\n"
    )
    tool.chmod(0o755)
    return tool


def _wait(done: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            sys.exit(f"{what} timed out")
        time.sleep(0.01)


def serve(pipe: Path) -> None:
    (pipe / PID_FILE).write_text(str(os.getpid()))
    quit_flag = pipe / "quit"
    while not quit_flag.exists():
        time.sleep(0.01)
    time.sleep(STOPPING_S)  # the real daemon stops its servers first
    quit_flag.unlink()
    (pipe / PID_FILE).unlink()


def main() -> None:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    if sys.argv[1:] == ["--serve"]:
        serve(pipe)
        return
    if sys.argv[1:] == ["-d"]:
        if os.environ.get("FAKE_MPS_REFUSE"):
            sys.exit("An instance of this daemon is already running (fake refusal)")
        subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait((pipe / PID_FILE).exists, "daemon start")
        return
    for line in sys.stdin:
        if line.strip() == "quit":
            if not (pipe / PID_FILE).exists():
                sys.exit("Cannot find MPS control daemon process")
            (pipe / "quit").touch()  # and back at once: the real tool does not wait either


if __name__ == "__main__":
    main()
