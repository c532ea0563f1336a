"""`parley serve --workers N`: a parent that keeps N server processes behind one port.

Each worker is a `parley serve` of its own (`python -m web.cli serve ... --worker-index k`):
its own event loop, uvicorn, app and listening socket, bound with SO_REUSEPORT to the same
host and port, so the kernel spreads new connections over the workers. All of them use the
one Redis the parent names (the embedded one, started by the parent), which keeps admission
global (the lease registry) and lets any process find a session's state.

The parent holds the port bound (not listening) from the start: `--port 0` is resolved once,
and the port stays ours while a worker restarts. A worker says it is ready by writing its
process id on a pipe; the parent prints the ready line once every worker has. Workers die
with the parent (PR_SET_PDEATHSIG) and run in their own session, so a Ctrl-C at the terminal
reaches only the parent, which forwards SIGTERM to each and waits for their drain. A worker
that exits on its own after the start is logged and started again; one that exits before
the server was ever ready stops the whole server (the same error would come back each time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

from .redis_server import _die_with_parent, _load_prctl
from .settings import Settings

log = logging.getLogger("parley.workers")

POLL_S = 0.05
RESTART_BACKOFF_S = 1.0
"""A worker that dies within this long of its start is restarted only after this long."""
STOP_MARGIN_S = 20.0
"""Past the drain deadline: uvicorn's graceful close and the sessions' goodbyes."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEPORT (not yet listening)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    ready_fd: int
    started: float
    process_id: str | None = None
    _buffer: bytes = b""

    def poll_ready(self) -> bool:
        """Read what the worker wrote on its pipe; True once it said it is ready."""
        if self.process_id is None:
            with contextlib.suppress(BlockingIOError):
                self._buffer += os.read(self.ready_fd, 256)
            if b"\n" in self._buffer:
                self.process_id = self._buffer.split(b"\n", 1)[0].decode()
        return self.process_id is not None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.ready_fd)


class WorkerPool:
    """The parent: starts, watches, restarts and stops the workers."""

    def __init__(self, argv: Sequence[str], settings: Settings, redis_url: str) -> None:
        self.argv = list(argv)
        self.settings = settings
        self.redis_url = redis_url
        self.workers: list[_Worker] = []
        self._stop_signal: int | None = None
        self._prctl = _load_prctl()

    def run(self) -> int:
        """Serve until SIGINT or SIGTERM; the exit status (0, or 1 if a worker never started)."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            with listening_socket(self.settings.host, self.settings.port) as reserved:
                port = int(reserved.getsockname()[1])
                self.workers = [self._start(k, port) for k in range(self.settings.workers)]
                status = self._watch(port)
                self._stop_all()
                return status
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for worker in self.workers:
                worker.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _start(self, index: int, port: int) -> _Worker:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        cmd = [
            sys.executable,
            "-m",
            "web.cli",
            *self.argv,
            "--port",
            str(port),
            "--redis-url",
            self.redis_url,
            "--worker-index",
            str(index),
            "--worker-ready-fd",
            str(write_fd),
        ]
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                pass_fds=(write_fd,),
                preexec_fn=_die_with_parent(self._prctl, os.getpid()),
                start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        log.info("worker %d started (pid %d)", index, proc.pid)
        return _Worker(index, proc, read_fd, time.monotonic())

    def _watch(self, port: int) -> int:
        announced = False
        restart_at: dict[int, float] = {}
        while self._stop_signal is None:
            for slot, worker in enumerate(self.workers):
                if announced and not worker.process_id and worker.poll_ready():
                    log.info("worker %d (pid %d) is ready", worker.index, worker.proc.pid)
                worker.poll_ready()
                code = worker.proc.poll()
                if code is None:
                    continue
                if not announced:
                    print(
                        f"parley: worker {worker.index} exited with status {code} "
                        "before the server was ready",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
                now = time.monotonic()
                if slot not in restart_at:
                    log.warning(
                        "worker %d (pid %d, %s) exited with status %d; starting it again",
                        worker.index,
                        worker.proc.pid,
                        worker.process_id,
                        code,
                    )
                    quick = now - worker.started < RESTART_BACKOFF_S
                    restart_at[slot] = now + (RESTART_BACKOFF_S if quick else 0.0)
                if now >= restart_at[slot]:
                    del restart_at[slot]
                    worker.close()
                    self.workers[slot] = self._start(worker.index, port)
            if not announced and all(w.poll_ready() for w in self.workers):
                announced = True
                base = self.settings.base_url.replace(f":{self.settings.port}/", f":{port}/")
                print(f"Parley is ready: open {base} ({len(self.workers)} workers)", flush=True)
            time.sleep(POLL_S)
        log.info("signal %d: stopping %d worker(s)", self._stop_signal, len(self.workers))
        return 0

    def _stop_all(self) -> None:
        """SIGTERM to every worker, then wait for their drain; SIGKILL past the deadline."""
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.terminate()
        deadline = time.monotonic() + self.settings.drain_s + STOP_MARGIN_S
        for worker in self.workers:
            try:
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop in time: killed", worker.index)
                worker.proc.kill()
                worker.proc.wait()
