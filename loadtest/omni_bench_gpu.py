"""GPU memory seen from outside: nvidia-smi polled in a thread.

The stage graph runs its engines in worker processes, so `torch.cuda.max_memory_allocated`
in the benchmark's own process sees none of them. nvidia-smi's `memory.used` is the whole
device's (every process on it, allocator caches included): the figure that decides whether a
configuration fits. Samples are kept with their time, so one poller gives the peak of the whole
phase and of each window inside it (one concurrency level). Without nvidia-smi (a CPU run)
every peak is None. A phase on several GPUs (the split and replica layouts) is sampled on
each of them at once, and a sample is their sum: the memory the phase holds in all.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from types import TracebackType


def device_index(device: str) -> int | None:
    """The GPU index of a torch device string ("cuda:1" -> 1, "cuda" -> 0, "cpu" -> None)."""
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index else 0


def gpu_memory_gib(index: int | Sequence[int] = 0) -> float | None:
    """memory.used of GPU `index` now (of several: their sum), in GiB (None without
    nvidia-smi or any of those GPUs)."""
    indices = [index] if isinstance(index, int) else list(index)
    if shutil.which("nvidia-smi") is None or not indices:
        return None
    command = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    ids = ",".join(str(i) for i in indices)
    try:
        out = subprocess.run(
            [*command, f"--id={ids}"], capture_output=True, text=True, timeout=20
        ).stdout
        values = [float(v) for v in out.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return sum(values) / 1024 if len(values) == len(indices) else None


class GpuMemoryPoller:
    """Samples memory.used every `interval_s` until closed; `peak()` over any time window."""

    def __init__(self, device: str | Sequence[str], interval_s: float = 0.5) -> None:
        devices = [device] if isinstance(device, str) else list(device)
        found = {i for d in devices if (i := device_index(d)) is not None}
        self.indices = sorted(found)
        self.interval_s = interval_s
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.indices and shutil.which("nvidia-smi") is not None:
            self._thread = threading.Thread(target=self._run, name="gpu-memory", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            used = gpu_memory_gib(self.indices)
            if used is not None:
                with self._lock:
                    self._samples.append((time.perf_counter(), used))
            self._stop.wait(self.interval_s)

    def peak(self, since: float | None = None, until: float | None = None) -> float | None:
        """The highest sample taken between `since` and `until` (perf_counter times)."""
        with self._lock:
            values = [
                used
                for at, used in self._samples
                if (since is None or at >= since) and (until is None or at <= until)
            ]
        return max(values) if values else None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> GpuMemoryPoller:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
