"""GPU memory seen from outside: nvidia-smi polled in a thread.

The stage graph runs its engines in worker processes, so `torch.cuda.max_memory_allocated`
in the benchmark's own process sees none of them. nvidia-smi's `memory.used` is the whole
device's (every process on it, allocator caches included): the figure that decides whether a
configuration fits. Samples are kept with their time, so one poller gives the peak of the whole
phase and of each window inside it (one concurrency level). Without nvidia-smi (a CPU run)
every peak is None.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from types import TracebackType


def device_index(device: str) -> int | None:
    """The GPU index of a torch device string ("cuda:1" -> 1, "cuda" -> 0, "cpu" -> None)."""
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index else 0


def gpu_memory_gib(index: int = 0) -> float | None:
    """memory.used of GPU `index` now, in GiB (None without nvidia-smi or that GPU)."""
    if shutil.which("nvidia-smi") is None:
        return None
    command = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(
            [*command, f"--id={index}"], capture_output=True, text=True, timeout=20
        ).stdout
        return float(out.split()[0]) / 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


class GpuMemoryPoller:
    """Samples memory.used every `interval_s` until closed; `peak()` over any time window."""

    def __init__(self, device: str, interval_s: float = 0.5) -> None:
        self.index = device_index(device)
        self.interval_s = interval_s
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.index is not None and shutil.which("nvidia-smi") is not None:
            self._thread = threading.Thread(target=self._run, name="gpu-memory", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self.index is not None
        while not self._stop.is_set():
            used = gpu_memory_gib(self.index)
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
