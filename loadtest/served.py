"""A `parley serve` in a child process for the benchmarks: started on free loopback ports,
waited for until it prints its ready line, and stopped with SIGTERM (killed if it lingers).

The ready line, not `/readyz`: with `--workers N` the first worker's /readyz answers 200
before the others listen, and a benchmark started then would send every client to it. The
parent prints the line once every worker is ready.

A child process, not the benchmark's own event loop: the server meets its clients as a
real deployment would, and the client's timestamps are not delayed by the server's work.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .proc_cpu import tree

START_S = 120.0
STOP_S = 20.0


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port free now (TCP by default; `socket.SOCK_DGRAM` for UDP)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Served:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@contextlib.contextmanager
def parley_serve(*options: str, start_s: float = START_S) -> Iterator[Served]:
    """`parley serve --port <free> OPTIONS...` (log level warning), ready."""
    port = free_port()
    exe = Path(sys.executable).parent / "parley"
    cmd = [str(exe), "serve", "--port", str(port), *options, "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    ready = threading.Event()
    reader = threading.Thread(target=_watch_stdout, args=(proc, ready), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + start_s
        while not ready.wait(0.1):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd)}: not ready")
        yield Served(proc, port)
    finally:
        family = tree(proc.pid)  # its workers run in sessions of their own
        proc.terminate()  # SIGTERM: sessions closed, the embedded Redis stopped
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            print(f"{' '.join(cmd)}: did not stop within {STOP_S:g} s; killed", file=sys.stderr)
            proc.kill()
            proc.wait()
        reader.join(STOP_S)  # the pipe's end: every process holding it has exited
        if reader.is_alive():  # a child outlived the server and holds the pipe
            print(f"{' '.join(cmd)}: left a process behind; killed", file=sys.stderr)
            for pid in family:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            reader.join(STOP_S)
        if proc.stdout is not None and not reader.is_alive():
            proc.stdout.close()  # (closing under a reading thread would wait for it)


def _watch_stdout(proc: subprocess.Popen[bytes], ready: threading.Event) -> None:
    """Set `ready` at the server's ready line, and keep reading its output to the end so
    the child never blocks on a full pipe."""
    assert proc.stdout is not None
    with contextlib.suppress(ValueError, OSError):  # closed under us after a stuck stop
        for line in proc.stdout:
            if line.startswith(b"Parley is ready"):
                ready.set()


def metric_total(exposition: str, name: str) -> float:
    """The sum over every sample of `name` in a /metrics text (one per worker process with
    `--workers`, each labelled by its process); 0 when there is none."""
    found = re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", exposition, re.M)
    return sum(float(v) for v in found)
