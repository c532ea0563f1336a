"""A stage process's GPU memory, read at its heartbeat and shown in the main process's
metrics. No GPU here: the CUDA and NVML sides are stand-ins with the calls `gpu_usage.py`
makes (torch's and pynvml's names and units), and the real heartbeat of a worker on the CPU
is checked to say nothing."""

from __future__ import annotations

import asyncio
import os
import re
from types import SimpleNamespace

from prometheus_client import generate_latest

from pipeline.capacity import RowLoad
from pipeline.gpu_usage import GpuUsage, GpuUsageWatch
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.metrics import PipelineMetrics
from pipeline.registry import build_engines
from pipeline.worker import WorkerEngine

GIB = 2**30


class StandInCuda:
    """torch.cuda's memory calls for one device whose use a test moves."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.reserved = 0
        self.peak_reserved = 0
        self.initialized = True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return self.total - self.used, self.total

    def memory_reserved(self, device: int) -> int:
        return self.reserved

    def max_memory_reserved(self, device: int) -> int:
        return self.peak_reserved


def stand_in_nvml(usage: dict[int, int]) -> SimpleNamespace:
    """pynvml's calls for one device whose processes use `usage` (pid -> bytes)."""
    return SimpleNamespace(
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetComputeRunningProcesses=lambda handle: [
            SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in usage.items()
        ],
    )


def test_a_process_that_never_started_cuda_has_no_figures() -> None:
    cuda = StandInCuda(80 * GIB)
    cuda.initialized = False
    assert GpuUsageWatch(torch_module=SimpleNamespace(cuda=cuda)).read() is None
    # this test process: torch may be imported, but CUDA never starts on this machine
    assert GpuUsageWatch().read() is None


def test_the_peaks_are_kept_when_the_use_falls() -> None:
    cuda = StandInCuda(80 * GIB)
    usage = {os.getpid(): 9 * GIB, os.getpid() + 1: 60 * GIB}
    watch = GpuUsageWatch(torch_module=SimpleNamespace(cuda=cuda), nvml=stand_in_nvml(usage))
    cuda.used, cuda.reserved, cuda.peak_reserved = 70 * GIB, 8 * GIB, 8 * GIB
    first = watch.read()
    assert first == GpuUsage(
        peak_reserved=8 * GIB,
        reserved=8 * GIB,
        device_total=80 * GIB,
        device_peak=70 * GIB,
        process_peak=9 * GIB,
    )
    cuda.used, cuda.reserved = 66 * GIB, 5 * GIB  # cached blocks went back
    usage[os.getpid()] = 6 * GIB
    later = watch.read()
    assert later is not None
    assert (later.reserved, later.peak_reserved) == (5 * GIB, 8 * GIB)
    assert (later.device_peak, later.process_peak) == (70 * GIB, 9 * GIB)


def test_a_process_nvml_does_not_list_has_no_process_figure() -> None:
    cuda = StandInCuda(80 * GIB)
    cuda.reserved = cuda.peak_reserved = GIB
    watch = GpuUsageWatch(
        torch_module=SimpleNamespace(cuda=cuda), nvml=stand_in_nvml({os.getpid() + 7: GIB})
    )
    usage = watch.read()
    assert usage is not None and usage.process_peak is None
    assert "process_peak" not in usage.figures()


class ReportingStage:
    """The part of a linked stage that the metrics read: its rows and its process's GPU."""

    def __init__(self, usage: GpuUsage | None) -> None:
        self.usage = usage

    def active_requests(self) -> int:
        return 0

    def row_load(self) -> RowLoad | None:
        return None

    def gpu_usage(self) -> GpuUsage | None:
        return self.usage


def test_each_stage_process_memory_is_scraped_by_its_stage_name() -> None:
    metrics = PipelineMetrics()
    usage = GpuUsage(
        peak_reserved=3 * GIB, reserved=2 * GIB, device_total=80 * GIB, device_peak=75 * GIB
    )
    metrics.watch_engine("code2wav", ReportingStage(usage))  # type: ignore[arg-type]
    metrics.watch_engine("talker", ReportingStage(None))  # type: ignore[arg-type]
    scraped = generate_latest(metrics.registry).decode()
    found = {
        labels: float(value)
        for labels, value in re.findall(r"^parley_gpu_memory_bytes\{(.*)\} (\S+)$", scraped, re.M)
    }
    assert found['measure="peak_reserved",process="code2wav"'] == 3 * GIB
    assert found['measure="device_peak",process="code2wav"'] == 75 * GIB
    assert 'process="talker"' not in scraped  # no CUDA there: nothing, not zeros
    assert 'process="main"' not in scraped


GRAPH = """
name: one_worker
stages:
  - name: echo
    engine: echo
    placement: {process: worker}
outputs: [echo]
"""


async def test_a_worker_on_the_cpu_beats_without_gpu_figures() -> None:
    graph_config = parse_graph(GRAPH)
    engines = build_engines(graph_config)
    graph = StageGraph(graph_config, engines)
    await graph.start()
    try:
        worker = engines["echo"]
        assert isinstance(worker, WorkerEngine)
        await asyncio.sleep(1.2)  # two heartbeats
        assert worker.gpu_usage() is None
        assert "parley_gpu_memory_bytes{" not in generate_latest(graph.metrics.registry).decode()
    finally:
        await graph.close()
