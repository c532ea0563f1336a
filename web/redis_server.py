"""The embedded Redis that `parley serve` starts when it is given no Redis URL.

A single-box deployment should not need a Redis to be set up first, but session state still
has to outlive a crash of ours, so the server is a real `redis-server` with the append-only
file on (fsync once a second: at most a second of writes lost to a power cut, none to a crash
of ours). It listens only on a unix socket inside a 0700 directory: nothing else on the host
can reach it, and there is no TCP port to collide with another Redis.

The server must never outlive us. It is tied to our life in two ways: the kernel sends it
SIGTERM when we die (PR_SET_PDEATHSIG, so even a SIGKILL of ours takes it down), and it runs
in its own session, so a Ctrl-C at the terminal reaches only us and we stop it in order,
after the sessions that use it have been closed.

Linux only (prctl). `start()` must run on the main thread: the death signal fires when the
*thread* that forked the server exits, so starting it from a worker thread would kill it as
soon as that thread finished.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .leftover_dirs import REDIS_PREFIX, sweep_stale_dirs, write_owner

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_POLL_S = 0.02
_LOG_TAIL_LINES = 20
_INSTALL_HINT = "install it with: apt-get install redis-server"


class RedisServerMissing(RuntimeError):
    """No `redis-server` binary to run; the message says how to get one."""

    def __init__(self, where: str = "on PATH") -> None:
        super().__init__(f"redis-server not found {where}; {_INSTALL_HINT}")


def _quote(value: str) -> str:
    """Quote a value for redis.conf, so paths with spaces or quotes stay one argument."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _load_prctl() -> Callable[..., int]:
    """Look up libc's prctl in the parent: the forked child should do as little as it can."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        prctl: Callable[..., int] = libc.prctl
    except AttributeError:
        raise RuntimeError("EmbeddedRedis needs Linux (prctl is not available)") from None
    return prctl


def _die_with_parent(prctl: Callable[..., int], parent_pid: int) -> Callable[[], None]:
    """A preexec_fn that asks the kernel to SIGTERM the child when its parent dies.

    If the parent died between fork and prctl, the death signal will never come (the child
    has already been re-parented), so the child checks and exits on its own.
    """

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


class EmbeddedRedis:
    """One `redis-server` child on a private unix socket; the sole owner of its process.

    Pass `runtime_dir` to keep the data (the append-only file) across restarts; that
    directory is left in place by `stop()`. Without it a fresh private directory is made
    in the temp dir and removed by `stop()`, data and all.
    """

    def __init__(self, runtime_dir: str | None = None, executable: str | None = None) -> None:
        self._given_dir = runtime_dir
        self._executable = executable
        self._dir: Path | None = Path(runtime_dir) if runtime_dir is not None else None
        self._created_dir = False
        self._proc: subprocess.Popen[bytes] | None = None

    # -- properties ---------------------------------------------------------------------

    @property
    def socket_path(self) -> str:
        """The server's unix socket; known once the runtime directory is."""
        if self._dir is None:
            raise RuntimeError("EmbeddedRedis has not been started")
        return str(self._dir / "redis.sock")

    @property
    def url(self) -> str:
        """A URL for `redis.asyncio.Redis.from_url` (database 0)."""
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        """The server's pid from `start()` until `stop()`, else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive (it may have died on its own)."""
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and return once it answers PING on its socket.

        Raises RedisServerMissing without the binary, and RuntimeError (with the tail of
        the server's log) if it exits or does not answer within `timeout`; in every
        failure the process is gone and a directory we made is removed.
        """
        if self._proc is not None:
            raise RuntimeError("EmbeddedRedis is already started")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("EmbeddedRedis.start() must run on the main thread")
        exe = self._find_executable()
        prctl = _load_prctl()
        try:
            self._prepare_dir()
            self._spawn(exe, prctl)
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after `timeout`); safe to call again.

        SIGTERM lets Redis flush the append-only file. The SIGKILL goes to the whole
        process group, so an AOF-rewrite child forked by the server goes with it.
        """
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._created_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._created_dir = False

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- steps of start() ---------------------------------------------------------------

    def _find_executable(self) -> str:
        found = shutil.which(self._executable or "redis-server")
        if found is None:
            where = "on PATH" if self._executable is None else f"at {self._executable}"
            raise RedisServerMissing(where)
        return found

    def _prepare_dir(self) -> None:
        """Make (or check) the runtime directory and write redis.conf into it."""
        if self._given_dir is None:
            sweep_stale_dirs(REDIS_PREFIX)  # what servers killed before their stop left
            self._dir = Path(tempfile.mkdtemp(prefix=REDIS_PREFIX))  # mkdtemp: mode 0700
            self._created_dir = True
        else:
            self._dir = Path(self._given_dir)
        conf = self._dir / "redis.conf"
        lines = [
            "port 0",
            f"unixsocket {_quote(self.socket_path)}",
            "unixsocketperm 700",
            f"dir {_quote(str(self._dir))}",
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            "daemonize no",
            f"logfile {_quote(str(self._log_path))}",
        ]
        try:
            if not self._created_dir:
                self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            conf.write_text("\n".join(lines) + "\n")
        except OSError as exc:
            raise RuntimeError(f"cannot prepare redis runtime dir {self._dir}: {exc}") from exc

    def _spawn(self, exe: str, prctl: Callable[..., int]) -> None:
        """Fork the server; its stdout/stderr go to the log, where early errors land too."""
        assert self._dir is not None
        preexec = _die_with_parent(prctl, os.getpid())
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [exe, str(self._dir / "redis.conf")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self._dir,
                preexec_fn=preexec,
                start_new_session=True,
            )
        if self._created_dir:
            write_owner(self._dir, self._proc.pid)

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        client = redis.Redis(
            unix_socket_path=self.socket_path,
            socket_connect_timeout=1.0,
            socket_timeout=1.0,
            retry=Retry(NoBackoff(), 0),  # we poll ourselves; the default backs off for seconds
        )
        try:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise RuntimeError(
                        f"redis-server exited with code {code} on start:\n{self._log_tail()}"
                    )
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if client.ping():
                        return
                if time.monotonic() >= deadline:
                    tail = self._log_tail()
                    raise RuntimeError(f"redis-server did not answer PING in {timeout:g}s:\n{tail}")
                time.sleep(_POLL_S)
        finally:
            client.close()

    @property
    def _log_path(self) -> Path:
        assert self._dir is not None
        return self._dir / "redis.log"

    def _log_tail(self) -> str:
        try:
            lines = self._log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(log is empty)"
