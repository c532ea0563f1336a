"""How a graph's stage processes share one GPU: CUDA's time slices, or MPS.

By default each process that uses a GPU has a CUDA context of its own and the GPU runs one
context at a time, in slices of a few milliseconds: a Thinker step in one stage process and a
Talker step in another never overlap, each waits out the other's slice, and under load a
session's audio runs dry while the GPU serves the other stage. Under MPS (CUDA's Multi-Process
Service) one server process holds a single context for all of them, so the kernels of several
stage processes run side by side. Measured on one H200 with Qwen3-Omni's three stages in three
worker processes (`loadtest.omni_bench`, both in one run): first audio at 10 sessions 2,984 ->
1,628 ms, RTF 0.73 -> 0.58, the longest playback stall p95 82 -> 26 ms.

`gpu_sharing: mps` in a graph file: whoever starts the graph's stage processes (the graph for
its worker stages, the parent's stage hosts under `parley serve --workers N`) first starts an
MPS control daemon on a private pipe directory and puts that directory in the environment the
processes inherit; `close` quits the daemon. Where CUDA_MPS_PIPE_DIRECTORY is already set, the
daemon there (the operator's own) is used and left running.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time

log = logging.getLogger("parley.pipeline.gpu_sharing")

MPS_CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
COMMAND_S = 15.0
"""The most a command to the control daemon (start, quit) may take."""
PID_FILE = "nvidia-cuda-mps-control.pid"
QUIT_POLL_S = 0.05


class GpuSharingError(RuntimeError):
    """The GPU cannot be shared as the graph file asks: says why and what to change."""


class MpsDaemon:
    """An MPS control daemon for the processes started after `start` (idempotent), quit by
    `close` (idempotent) if this object started it."""

    def __init__(self, control: str = MPS_CONTROL) -> None:
        self.control = control
        self.pipe_dir: str | None = None
        self._root: str | None = None
        self._binary: str | None = None
        self._started = False

    @property
    def owned(self) -> bool:
        """Whether `close` quits a daemon (one this object started)."""
        return self._root is not None

    def start(self) -> None:
        if self._started:
            return
        if existing := os.environ.get(PIPE_ENV):
            self._started, self.pipe_dir = True, existing
            log.info("GPU shared through the MPS daemon already at %s", existing)
            return
        binary = shutil.which(self.control)
        if binary is None:
            raise GpuSharingError(
                f"gpu_sharing: mps needs {self.control} (installed with the NVIDIA driver) on "
                "PATH; install it, or set gpu_sharing: none in the graph file"
            )
        root = tempfile.mkdtemp(prefix="parley-mps-")  # mode 0700: ours alone
        pipe_dir, log_dir = os.path.join(root, "pipe"), os.path.join(root, "log")
        os.mkdir(pipe_dir)
        os.mkdir(log_dir)
        env = {**os.environ, PIPE_ENV: pipe_dir, LOG_ENV: log_dir}
        try:
            subprocess.run(
                [binary, "-d"], env=env, check=True, capture_output=True, timeout=COMMAND_S
            )
        except (OSError, subprocess.SubprocessError) as exc:
            detail = _detail(exc)
            shutil.rmtree(root, ignore_errors=True)
            raise GpuSharingError(
                f"the MPS control daemon did not start ({detail}); set gpu_sharing: none in "
                "the graph file to run without it"
            ) from None
        os.environ[PIPE_ENV], os.environ[LOG_ENV] = pipe_dir, log_dir
        self._root, self._binary, self.pipe_dir, self._started = root, binary, pipe_dir, True
        log.info("GPU shared through MPS: control daemon on %s (logs in %s)", pipe_dir, log_dir)

    def close(self) -> None:
        root, self._root = self._root, None
        self._started = False
        if root is None or self._binary is None:
            return
        pipe_dir = str(self.pipe_dir)
        env = {**os.environ, PIPE_ENV: pipe_dir, LOG_ENV: os.path.join(root, "log")}
        if os.environ.get(PIPE_ENV) == pipe_dir:
            os.environ.pop(PIPE_ENV, None)
            os.environ.pop(LOG_ENV, None)
        daemon = _daemon_pid(pipe_dir)
        try:
            subprocess.run(
                [self._binary], input=b"quit\n", env=env, capture_output=True, timeout=COMMAND_S
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.error("the MPS control daemon on %s did not quit: %s", pipe_dir, _detail(exc))
        else:  # `quit` returns once asked; the daemon stops its servers, then itself
            deadline = time.monotonic() + COMMAND_S
            while daemon is not None and _running(daemon) and time.monotonic() < deadline:
                time.sleep(QUIT_POLL_S)
            log.info("the MPS control daemon on %s quit", pipe_dir)
        shutil.rmtree(root, ignore_errors=True)


def _daemon_pid(pipe_dir: str) -> int | None:
    """The control daemon's process id, from the file it keeps in its pipe directory."""
    try:
        with open(os.path.join(pipe_dir, PID_FILE)) as file:
            return int(file.read().strip())
    except (OSError, ValueError):
        return None


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _detail(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        said = (exc.stderr or exc.stdout or b"").decode(errors="replace").strip()
        return f"exit status {exc.returncode}" + (f": {said}" if said else "")
    return str(exc) or type(exc).__name__
