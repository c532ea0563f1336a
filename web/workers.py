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

Stages the graph places in a worker process are not started by each worker: the parent
starts one stage host per stage (`stage_hosts.py`) before the workers, and the workers dial
it. Hosts are watched, restarted and reported like workers, and stopped after them. A host
also beats on its ready pipe while its engine makes progress; one silent for its stage's
`hang_s` (stopped, or its engine stuck in a step) is hung: it is killed (SIGKILL) and so
started again like one that died. The workers find it hung first (they see the same silence
on their links at `hang_s`; the parent waits `HANG_MARGIN_S` more), so its requests fail
with that reason rather than as a death, and /readyz names the stage until it is back.

Under `gpu_sharing: mps` the hosts are clients of one MPS daemon, which a failing client
poisons for all of them (`pipeline/mps_restart.py`): a host that ends is not started again
alone. Every other host is killed, the daemon quit and a fresh one started, and then every
host starts again (the workers fail the requests in flight and dial again).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from types import FrameType

from pipeline.gpu_sharing import GpuSharingError
from pipeline.worker import stage_environment

from .redis_server import _die_with_parent, _load_prctl
from .settings import Settings
from .stage_hosts import StageHosts

log = logging.getLogger("parley.workers")

POLL_S = 0.05
RESTART_BACKOFF_S = 1.0
"""A worker that dies within this long of its start is restarted only after this long."""
STOP_MARGIN_S = 20.0
"""Past the drain deadline: uvicorn's graceful close and the sessions' goodbyes."""
HOST_STOP_S = 10.0
"""A stage host's engine closing, once every worker has gone."""
HANG_MARGIN_S = 1.0
"""A stage host silent for its hang_s and this long is killed: the workers, which find it
hung at hang_s, have failed its requests with that reason by then."""


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
class _Child:
    """A worker or a stage host: a process that says it is ready with a line on a pipe."""

    label: str
    host: bool
    """A stage host (stopped after the workers), not a server worker."""
    proc: subprocess.Popen[bytes]
    ready_fd: int
    started: float
    hang_s: float | None = None
    """A stage host's: silent this long after it said ready, it is hung."""
    said: str | None = None
    """The ready line: a worker's process id, a stage host's "ready"."""
    heard: float = 0.0
    """When it last wrote on its pipe (a stage host beats there once ready)."""
    killed: bool = False
    _buffer: bytes = b""

    def poll_ready(self) -> bool:
        """Read what the child wrote on its pipe; True once it said it is ready."""
        try:
            data = os.read(self.ready_fd, 256)
        except (BlockingIOError, OSError):
            data = b""
        if data:
            self.heard = time.monotonic()
        if self.said is None:
            self._buffer += data
            if b"\n" in self._buffer:
                self.said = self._buffer.split(b"\n", 1)[0].decode()
                self._buffer = b""
        return self.said is not None

    def hung(self, now: float) -> bool:
        """A ready stage host that has not beaten for its hang_s (and was not killed yet)."""
        return (
            self.hang_s is not None
            and self.said is not None
            and not self.killed
            and now - self.heard > self.hang_s + HANG_MARGIN_S
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.ready_fd)


class WorkerPool:
    """The parent: starts, watches, restarts and stops the stage hosts and the workers."""

    def __init__(self, argv: Sequence[str], settings: Settings, redis_url: str) -> None:
        self.argv = list(argv)
        self.settings = settings
        self.redis_url = redis_url
        self.children: list[_Child] = []
        self._respawn: dict[str, Callable[[], _Child]] = {}
        self._stop_signal: int | None = None
        self._prctl = _load_prctl()
        self._hosts: StageHosts | None = None

    def run(self) -> int:
        """Serve until SIGINT or SIGTERM; the exit status (0, or 1 if a child never started)."""
        hosts = StageHosts(  # GpuSharingError: the graph asks for MPS, which cannot start
            self.settings.pipeline if self.settings.stage_hosts else None, self.settings.log_level
        )
        self._hosts = hosts
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            with listening_socket(self.settings.host, self.settings.port) as reserved:
                port = int(reserved.getsockname()[1])
                for stage in hosts.stages:
                    label = f"stage host {stage.spec.stage}"
                    self._add(label, stage.command, host=True, hang_s=stage.spec.hang_s)
                for k in range(self.settings.workers):
                    command = partial(self._worker_command, k, port, hosts)
                    self._add(f"worker {k}", command, host=False)
                status = self._watch(port)
                self._stop_all()
                return status
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for child in self.children:
                child.close()
            hosts.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _worker_command(self, index: int, port: int, hosts: StageHosts, ready_fd: int) -> list[str]:
        return [
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
            str(ready_fd),
            *hosts.worker_option(),
        ]

    def _add(
        self,
        label: str,
        command: Callable[[int], list[str]],
        *,
        host: bool,
        hang_s: float | None = None,
    ) -> None:
        self._respawn[label] = partial(self._spawn, label, command, host, hang_s)
        self.children.append(self._respawn[label]())

    def _spawn(
        self, label: str, command: Callable[[int], list[str]], host: bool, hang_s: float | None
    ) -> _Child:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        try:
            proc = subprocess.Popen(
                command(write_fd),
                stdin=subprocess.DEVNULL,
                pass_fds=(write_fd,),
                env=stage_environment() if host else None,
                preexec_fn=_die_with_parent(self._prctl, os.getpid()),
                start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        log.info("%s started (pid %d)", label, proc.pid)
        return _Child(label, host, proc, read_fd, time.monotonic(), hang_s)

    def _watch(self, port: int) -> int:
        announced = False
        restart_at: dict[int, float] = {}
        while self._stop_signal is None:
            for slot, child in enumerate(self.children):
                if announced and not child.said and child.poll_ready():
                    log.info("%s (pid %d) is ready", child.label, child.proc.pid)
                child.poll_ready()
                code = child.proc.poll()
                if code is None:
                    if announced and child.hung(time.monotonic()):
                        log.error(
                            "%s (pid %d) sent no heartbeat for %g s: hung; killing it",
                            child.label,
                            child.proc.pid,
                            (child.hang_s or 0.0) + HANG_MARGIN_S,
                        )
                        child.killed = True
                        child.proc.kill()  # the next round starts it again
                    continue
                if not announced:
                    print(
                        f"parley: {child.label} exited with status {code} "
                        "before the server was ready",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
                now = time.monotonic()
                if slot not in restart_at:
                    log.warning(
                        "%s (pid %d, %s) exited with status %d; starting it again",
                        child.label,
                        child.proc.pid,
                        child.said,
                        code,
                    )
                    quick = now - child.started < RESTART_BACKOFF_S
                    restart_at[slot] = now + (RESTART_BACKOFF_S if quick else 0.0)
                if now >= restart_at[slot]:
                    del restart_at[slot]
                    if child.host and self._under_own_mps():
                        self._restart_hosts(child.label)
                        for other, peer in enumerate(self.children):
                            if peer.host:
                                restart_at.pop(other, None)
                        continue
                    child.close()
                    self.children[slot] = self._respawn[child.label]()
            if not announced and all(c.poll_ready() for c in self.children):
                announced = True
                base = self.settings.base_url.replace(f":{self.settings.port}/", f":{port}/")
                workers = self.settings.workers
                print(f"Parley is ready: open {base} ({workers} workers)", flush=True)
            time.sleep(POLL_S)
        log.info("signal %d: stopping %d process(es)", self._stop_signal, len(self.children))
        return 0

    def _under_own_mps(self) -> bool:
        return self._hosts is not None and self._hosts.gpu is not None and self._hosts.gpu.owned

    def _restart_hosts(self, ended: str) -> None:
        """Every stage host again under a fresh MPS daemon (see the module's docstring)."""
        assert self._hosts is not None and self._hosts.gpu is not None
        hosts = [child for child in self.children if child.host]
        log.error(
            "%s ended under MPS: restarting every stage host (%d) with a fresh MPS daemon",
            ended,
            len(hosts),
        )
        for child in hosts:
            if child.proc.poll() is None:
                child.killed = True
                child.proc.kill()
        for child in hosts:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(5.0)
        try:
            self._hosts.gpu.restart()
        except GpuSharingError as exc:  # they start again without MPS: slower, but up
            log.error("%s; the stage hosts start again without it", exc)
        for slot, child in enumerate(self.children):
            if child.host:
                child.close()
                self.children[slot] = self._respawn[child.label]()

    def _stop_all(self) -> None:
        """SIGTERM to every worker, then wait for their drain (SIGKILL past the deadline);
        then the same for the stage hosts, which the workers used until the end."""
        hosts = [c for c in self.children if c.host]
        workers = [c for c in self.children if not c.host]
        _terminate(workers, self.settings.drain_s + STOP_MARGIN_S)
        _terminate(hosts, HOST_STOP_S)


def _terminate(children: Sequence[_Child], within_s: float) -> None:
    for child in children:
        if child.proc.poll() is None:
            child.proc.terminate()
    deadline = time.monotonic() + within_s
    for child in children:
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time: killed", child.label)
            child.proc.kill()
            child.proc.wait()
