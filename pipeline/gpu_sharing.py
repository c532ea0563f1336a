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

A server killed outright (SIGKILL, a crash, `worker_main.exit_broken`'s fast exit) cannot quit
its daemon, and a daemon left behind keeps its MPS server and GPU memory. So each daemon's
private directory records the process that started it (`OWNER_FILE`: its pid and start
time), and every `start` first looks for directories (`parley-mps-*` in the temporary
directory) whose owner is gone, quits their daemons and removes them, logging each one
(`sweep_stale`). `restart` quits ours and starts a fresh one (mps_restart.py says why).
"""

from __future__ import annotations

import glob
import json
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
ROOT_PREFIX = "parley-mps-"
OWNER_FILE = "owner.json"
"""In a daemon's private directory: the pid and start time of the process that started it."""


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
        sweep_stale(binary)
        root = tempfile.mkdtemp(prefix=ROOT_PREFIX)  # mode 0700: ours alone
        with open(os.path.join(root, OWNER_FILE), "w") as file:
            json.dump({"pid": os.getpid(), "started": _start_time(os.getpid())}, file)
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
        if os.environ.get(PIPE_ENV) == pipe_dir:
            os.environ.pop(PIPE_ENV, None)
            os.environ.pop(LOG_ENV, None)
        if _quit(self._binary, root):
            log.info("the MPS control daemon on %s quit", pipe_dir)

    def restart(self) -> None:
        """Quit our daemon and start a fresh one (its clients must have exited first)."""
        self.close()
        self.start()


def sweep_stale(binary: str, directory: str | None = None) -> list[str]:
    """Quit the daemons whose starter is gone (see the module's docstring) and remove their
    directories; the directories swept. A directory without an owner record is left alone
    (one being made right now, or not ours)."""
    swept: list[str] = []
    for root in sorted(
        glob.glob(os.path.join(directory or tempfile.gettempdir(), ROOT_PREFIX + "*"))
    ):
        try:
            with open(os.path.join(root, OWNER_FILE)) as file:
                owner = json.load(file)
            pid, started = int(owner["pid"]), owner.get("started")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _running(pid) and _start_time(pid) == started:
            continue
        daemon = _daemon_pid(os.path.join(root, "pipe"))
        log.warning(
            "found an MPS control daemon (pid %s) on %s left by process %d, which is gone; "
            "quitting it",
            daemon if daemon is not None and _running(daemon) else "not running",
            root,
            pid,
        )
        if daemon is not None and _running(daemon):
            _quit(binary, root)
        shutil.rmtree(root, ignore_errors=True)
        swept.append(root)
    return swept


def _quit(binary: str, root: str) -> bool:
    """Ask the daemon of `root` to quit, wait until it has, remove `root`; whether it quit."""
    pipe_dir = os.path.join(root, "pipe")
    env = {**os.environ, PIPE_ENV: pipe_dir, LOG_ENV: os.path.join(root, "log")}
    daemon = _daemon_pid(pipe_dir)
    quit_ok = True
    try:
        subprocess.run([binary], input=b"quit\n", env=env, capture_output=True, timeout=COMMAND_S)
    except (OSError, subprocess.SubprocessError) as exc:
        log.error("the MPS control daemon on %s did not quit: %s", pipe_dir, _detail(exc))
        quit_ok = False
    else:  # `quit` returns once asked; the daemon stops its servers, then itself
        deadline = time.monotonic() + COMMAND_S
        while daemon is not None and _running(daemon) and time.monotonic() < deadline:
            time.sleep(QUIT_POLL_S)
    shutil.rmtree(root, ignore_errors=True)
    return quit_ok


def _start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with its pid, names one process even
    after the pid is used again."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return int(file.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


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
