"""A `parley serve` for the fault drill: `python -m web.cli serve` in a child process, its
output appended to a log file, its `/readyz` read as a client would, and started again each
time it exits by itself, as its supervisor (systemd, Kubernetes) would: a server whose stage
in its own process broke (Moshi's clock after a sticky device error) exits for exactly that.

Unlike `served.parley_serve` (the benchmarks' server, ready at its ready line, output
discarded), the drill needs the log (the start-up's capacity lines, what each fault did) and
a server that comes back. Stopped with SIGTERM (SIGKILL after 20 s); whatever of its process
tree is left then, or after it exited by itself, is killed (each pid checked against the
command line it had, so a reused pid is left alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .proc_cpu import cmdline, tree
from .served import free_port

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.05
CAPACITY = re.compile(r"capacity|memory|rows|session cap", re.I)
"""The start-up's log lines that say what the server can hold."""
RESTARTS = 5
"""A server that keeps exiting is started again this many times at most."""


async def readyz(port: int) -> tuple[int | None, str]:
    """`/readyz`'s status (None: no answer within 2 s) and body."""
    try:
        async with asyncio.timeout(2.0):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = await reader.read()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        head, _, body = answer.decode(errors="replace").partition("\r\n\r\n")
        return int(head.split()[1]), body
    except (OSError, TimeoutError, IndexError, ValueError):
        return None, ""


class Server:
    """`python -m web.cli serve --pipeline P --port <free> OPTIONS` with `env` added."""

    def __init__(
        self, pipeline: str, options: list[str], env: dict[str, str], log_path: Path
    ) -> None:
        self.port = free_port()
        self.cmd = [sys.executable, "-m", "web.cli", "serve", "--pipeline", pipeline]
        self.cmd += ["--port", str(self.port), *options]
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.family: dict[int, str] = {}
        """The server's processes when last looked at, with their command lines."""
        self.starts: list[dict[str, Any]] = []
        self.exits: list[dict[str, Any]] = []
        self._started_at = 0.0
        self._log_from = 0

    def start(self) -> None:
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT
            )
        self._started_at = time.monotonic()

    async def ready(self, wait_s: float) -> float | None:
        """Seconds from the last (re)start to `/readyz` 200 (its start-up's log lines about
        capacity noted once), or None: not within `wait_s` from now."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if (await readyz(self.port))[0] != 200:
                await asyncio.sleep(POLL_S)
                continue
            took = time.monotonic() - self._started_at
            if self._log_from >= 0:
                with self.log_path.open("rb") as log:
                    log.seek(self._log_from)
                    lines = log.read().decode(errors="replace").splitlines()
                found = [line for line in lines if CAPACITY.search(line)]
                self.starts.append({"ready_s": round(took, 2), "capacity_lines": found})
                self._log_from = -1
            return took
        return None

    def look(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.family = {pid: cmdline(pid) for pid in tree(self.proc.pid)}

    async def supervise(self) -> None:
        """Start the server again each time it exits (after killing what it left)."""
        while True:
            self.look()
            await asyncio.sleep(0.5)
            if (
                self.proc is not None
                and self.proc.poll() is not None
                and len(self.exits) < RESTARTS
            ):
                self.exits.append({"status": self.proc.returncode, "at": time.monotonic()})
                print(f"  server exited with status {self.proc.returncode}; starting it again")
                self._kill_left()
                self.start()

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after 20 s), then SIGKILL whatever it left."""
        self.look()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._kill_left()

    def _kill_left(self) -> None:
        for pid, cmd in self.family.items():
            if cmd and cmdline(pid) == cmd:  # still the same process, not a reused pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.family = {}

    def stage_pid(self, stage: str) -> int | None:
        """The worker (or stage host) process that serves `stage`."""
        if self.proc is None:
            return None
        for pid in tree(self.proc.pid):
            cmd = cmdline(pid)
            if " -m pipeline." in cmd and f'"stage": "{stage}"' in cmd:
                return pid  # pipeline.worker_main or pipeline.stage_host
        return None
