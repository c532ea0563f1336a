"""The server under test: `parley serve` (loadtest.served) on a redis-server of the run's own,
and what the runner reads of them.

The run's own Redis (a unix socket, nothing on disk) lets it count the server's keys before
and after; the sampler thread records the server's CPU and memory (its process and its
children: worker processes, not the Redis) and the load generator's, twice a second, and
how long each one's main thread waited for a CPU while runnable (/proc/PID/schedstat): on a
shared machine that wait, not the code, can be what makes a step slow.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import redis as redis_sync

from ..served import Served, metric_total, parley_serve

SAMPLE_S = 0.5


@contextlib.contextmanager
def own_redis() -> Iterator[str]:
    """A private redis-server on a unix socket: its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed")
    with tempfile.TemporaryDirectory(prefix="parley-locust-") as folder:
        sock = Path(folder) / "redis.sock"
        cmd = [exe, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while not sock.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.02)
            yield f"unix://{sock}?db=0"
        finally:
            proc.terminate()
            proc.wait(10)


@contextlib.contextmanager
def serve(
    pipeline: str, max_sessions: int, redis_url: str, extra: list[str] | None = None
) -> Iterator[Served]:
    options = ["--pipeline", pipeline, "--max-sessions", str(max_sessions), *(extra or [])]
    with parley_serve(*options, "--redis-url", redis_url) as served:
        yield served


def redis_keys(redis_url: str) -> int:
    client = redis_sync.Redis.from_url(redis_url)
    try:
        return int(client.dbsize())
    finally:
        client.close()


def redis_key_names(redis_url: str, most: int = 20) -> list[str]:
    """Up to `most` key names (what a churn left behind, by name)."""
    client = redis_sync.Redis.from_url(redis_url)
    try:
        names = [bytes(k).decode(errors="replace") for k in client.scan_iter(count=100)]
    finally:
        client.close()
    return sorted(names)[:most]


def metrics(http_url: str) -> dict[str, float]:
    """The server's WebRTC frame counters and live sessions."""
    text = httpx.get(f"{http_url}/metrics", timeout=10).text
    return {
        "late_frames": metric_total(text, "parley_webrtc_late_frames_total"),
        "outbound_frames": metric_total(text, "parley_webrtc_outbound_frames_total"),
    }


def resources(pid: int) -> dict[str, float]:
    """fds, threads and RSS (MB) of one process."""
    proc = psutil.Process(pid)
    return {
        "fds": proc.num_fds(),
        "threads": proc.num_threads(),
        "rss_mb": round(proc.memory_info().rss / 2**20, 1),
    }


class Sampler:
    """CPU % and RSS of the server (with its children) and of the generator, over time."""

    def __init__(self, server_pid: int) -> None:
        self.rows: list[dict[str, float]] = []
        self.generator_pid: int | None = None
        self.step = 0
        self._server = psutil.Process(server_pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()
        self._cpu: dict[int, float] = {}
        self._waited: dict[int, float] = {}

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _usage(self, root: psutil.Process) -> tuple[float, float]:
        cpu = rss = 0.0
        with contextlib.suppress(psutil.Error):
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    if proc.name().startswith("redis"):
                        continue
                    times = proc.cpu_times()
                    total = times.user + times.system
                    cpu += total - self._cpu.get(proc.pid, total)
                    self._cpu[proc.pid] = total
                    rss += proc.memory_info().rss
        return cpu, rss / 2**20

    def _runq(self, pid: int) -> float:
        """Seconds the process's main thread (the server's event loop, Locust's hub) has
        waited in the run queue, runnable but not running: the machine's contention."""
        try:
            waited = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0
        delta = waited - self._waited.get(pid, waited)
        self._waited[pid] = waited
        return delta

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(SAMPLE_S):
            now = time.monotonic()
            cpu, rss = self._usage(self._server)
            row = {
                "t": round(now - self._t0, 2),
                "step": self.step,
                "server_cpu_pct": round(100 * cpu / (now - last), 1),
                "server_rss_mb": round(rss, 1),
                "server_runq_pct": round(100 * self._runq(self._server.pid) / (now - last), 1),
            }
            if self.generator_pid is not None:
                with contextlib.suppress(psutil.Error):
                    cpu, rss = self._usage(psutil.Process(self.generator_pid))
                    row["generator_cpu_pct"] = round(100 * cpu / (now - last), 1)
                    row["generator_rss_mb"] = round(rss, 1)
                    runq = self._runq(self.generator_pid)
                    row["generator_runq_pct"] = round(100 * runq / (now - last), 1)
            self.rows.append(row)
            last = now
