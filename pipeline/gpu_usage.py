"""What a stage process holds on its GPU while it serves, against what sizing planned.

Sizing (`memory_plan.py`) plans each stage's weights, KV and a headroom estimate (its CUDA
context, activations, graphs, the allocator's slack); only a run on the card says whether
the estimate held. A stage process reads its figures at each heartbeat and sends them with
`Alive`, and the main process shows them as `parley_gpu_memory_bytes` (`metrics.py`),
which the benchmarks keep in their reports:

- `peak_reserved`: the most this process's torch allocator ever reserved (exact: torch keeps
  the peak), every device together. Weights, KV, activations, CUDA graphs' pools and slack;
  not the CUDA context, which is the driver's.
- `reserved`: what the allocator reserves now.
- `process_peak`: the process's memory as the driver counts it (NVML: its context
  included), the highest seen at a heartbeat; absent where NVML (`pynvml`) cannot be loaded
  or does not list this process (another PID namespace).
- `device_peak`: the whole device's used memory (total - free, every process on it), the
  highest seen at a heartbeat; with `device_total`, what a card of that size had left.

A process that never started CUDA (a CPU engine, the tests) has no figures (None): nothing
here imports torch or starts a CUDA context for the sake of measuring.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("parley.pipeline.gpu_usage")


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One stage process's GPU memory, bytes (see the module's docstring)."""

    peak_reserved: int
    reserved: int
    device_total: int
    device_peak: int
    process_peak: int | None = None

    def figures(self) -> dict[str, int]:
        """The measures by name, the absent one left out (the metric's `measure` label)."""
        found = {
            "peak_reserved": self.peak_reserved,
            "reserved": self.reserved,
            "device_total": self.device_total,
            "device_peak": self.device_peak,
        }
        if self.process_peak is not None:
            found["process_peak"] = self.process_peak
        return found


class GpuUsageWatch:
    """Reads this process's `GpuUsage` (once a heartbeat) and keeps the sampled peaks."""

    def __init__(self, *, torch_module: Any = None, nvml: Any = None) -> None:
        """`torch_module` and `nvml` stand in for torch and pynvml where the tests have no
        GPU (by default: torch if this process imported it, pynvml if it loads)."""
        self._torch = torch_module
        self._device_peak = 0
        self._process_peak: int | None = None
        self._nvml: Any = nvml
        self._nvml_tried = nvml is not None

    def read(self) -> GpuUsage | None:
        """None while this process has not started CUDA (or has no torch at all)."""
        torch: Any = self._torch or sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        devices = [
            d for d in range(torch.cuda.device_count()) if torch.cuda.memory_reserved(d) > 0
        ] or [torch.cuda.current_device()]
        total = used = 0
        for device in devices:
            free, size = torch.cuda.mem_get_info(device)
            total += size
            used += size - free
        self._device_peak = max(self._device_peak, used)
        if (process := self._process_used()) is not None:
            self._process_peak = max(self._process_peak or 0, process)
        return GpuUsage(
            peak_reserved=sum(torch.cuda.max_memory_reserved(d) for d in devices),
            reserved=sum(torch.cuda.memory_reserved(d) for d in devices),
            device_total=total,
            device_peak=self._device_peak,
            process_peak=self._process_peak,
        )

    def _process_used(self) -> int | None:
        """This process's memory as NVML lists it, every device together, or None. NVML's
        device indices are not CUDA's where CUDA_VISIBLE_DEVICES reorders them, so every
        device is searched for this PID."""
        nvml = self._load_nvml()
        if nvml is None:
            return None
        pid = os.getpid()
        found: int | None = None
        with contextlib.suppress(Exception):  # NVML errors are its own class tree
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid == pid and process.usedGpuMemory is not None:
                        found = (found or 0) + int(process.usedGpuMemory)
        return found

    def _load_nvml(self) -> Any:
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                import pynvml  # type: ignore[import-not-found,unused-ignore]

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception as error:  # absent, or no driver library: figures without it
                log.info("no per-process GPU memory (NVML unavailable: %s)", error)
        return self._nvml
