"""Start one peer's server in a child process (its own session, its own venv) and stop it.

Every server runs `python -m loadtest.peers.bots.<peer>_bot` from the repository root, so the
probe (probe.py) is loaded before the framework. Parley runs from this checkout's python; the
others from the venvs `python -m loadtest.peers.setup` built. Ready = the probe answers and
the server answers HTTP (Parley: /readyz 200, the others: any status on /docs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadtest.peers.setup import home, venv_python
from loadtest.served import free_port

ROOT = Path(__file__).resolve().parents[2]
READY_S = 240.0
STOP_S = 15.0


@dataclass(frozen=True, slots=True)
class Server:
    peer: str
    pid: int
    url: str
    probe_url: str


def interpreter(peer: str) -> Path:
    if peer == "parley":
        return Path(sys.executable)
    python = venv_python(peer)
    if not python.exists():
        raise SystemExit(f"{python} is missing: run python -m loadtest.peers.setup {peer}")
    return python


def _ready(peer: str, url: str, probe_url: str) -> bool:
    try:
        httpx.get(f"{probe_url}/stats", timeout=2)
        response = httpx.get(f"{url}{'/readyz' if peer == 'parley' else '/docs'}", timeout=2)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 if peer == "parley" else True


@contextlib.contextmanager
def serve(peer: str, reply_s: float, log: Path) -> Iterator[Server]:
    port, probe_port = free_port(), free_port()
    env = {**os.environ, "PORT": str(port), "PROBE_PORT": str(probe_port)}
    env.update(REPLY_S=f"{reply_s:.3f}", PEERS_HOME=str(home()))
    cmd = [str(interpreter(peer)), "-m", f"loadtest.peers.bots.{peer}_bot"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    url, probe_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}"
    try:
        deadline = time.monotonic() + READY_S
        while not _ready(peer, url, probe_url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{peer} server did not come up (see {log}):\n{tail}")
            time.sleep(0.2)
        yield Server(peer, proc.pid, url, probe_url)
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
