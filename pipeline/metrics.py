"""Per-stage instruments: time to first chunk, chunks, queue depth, batch size, and the
cache rows (in use, turns waiting for one, turns refused `server_busy`: `row_gate.py`),
the outcomes of turns streamed while the user spoke (`StreamingInput`), and each process's
GPU memory (`gpu_usage.py`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .capacity import RowLoad
from .gpu_usage import GpuUsage, GpuUsageWatch
from .types import Engine, StreamingInput

RequestKind = Literal["answer", "transcription"]

_TTFC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PipelineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._ttfc = Histogram(
            "parley_stage_first_chunk_seconds",
            "Time from a request reaching a stage to the first chunk it produced, by kind of "
            "request (answer, transcription); a request that ends with no output is not counted",
            ["stage", "kind"],
            buckets=_TTFC_BUCKETS,
            registry=r,
        )
        self._chunks = Counter(
            "parley_stage_chunks",
            "Chunks produced per stage (rate() gives chunks/s)",
            ["stage"],
            registry=r,
        )
        self._depth = Gauge(
            "parley_stage_queue_depth", "Chunks waiting at a stage's input", ["stage"], registry=r
        )
        self._batch = Gauge(
            "parley_stage_batch_size",
            "Requests in the stage's last forward pass",
            ["stage"],
            registry=r,
        )
        self._active = Gauge(
            "parley_stage_active_requests",
            "Requests holding state in a stage",
            ["stage"],
            registry=r,
        )
        self._rows = _RowCollector()
        r.register(self._rows)
        self._gpu = _GpuCollector()
        r.register(self._gpu)

    def watch_engine(self, stage: str, engine: Engine) -> None:
        self._batch.labels(stage).set_function(lambda: float(getattr(engine, "batch_size", 0)))
        self._active.labels(stage).set_function(lambda: float(engine.active_requests()))
        self._rows.engines[stage] = engine
        if isinstance(engine, ReportsGpuUsage):
            self._gpu.processes[stage] = engine.gpu_usage

    def watch_rows(self, name: str, load: Callable[[], RowLoad] | None) -> None:
        """Rows that are no engine's (the graph's own admission: `graph_admission.py`),
        reported under `name` beside the stages'; None stops reporting them."""
        if load is None:
            self._rows.gates.pop(name, None)
        else:
            self._rows.gates[name] = load

    def first_chunk(self, stage: str, kind: RequestKind, seconds: float) -> None:
        """Once per request that a stage produced output for: a transcription-only
        request (a user turn no answer follows yet) is its own kind, and one that ended
        without output (the Talker's share of a transcription) is none."""
        self._ttfc.labels(stage, kind).observe(seconds)

    def chunk(self, stage: str) -> None:
        self._chunks.labels(stage).inc()

    def queue_depth(self, stage: str, depth: int) -> None:
        self._depth.labels(stage).set(depth)


@runtime_checkable
class ReportsGpuUsage(Protocol):
    """An engine served by another process, which reports that process's GPU memory
    (`stage_client.LinkedStage`)."""

    def gpu_usage(self) -> GpuUsage | None: ...


class _GpuCollector(Collector):
    """`parley_gpu_memory_bytes` of each stage process (by its stage's name) and of the
    main process (`main`: the stages placed there), for each process that started CUDA."""

    def __init__(self) -> None:
        self.processes: dict[str, Callable[[], GpuUsage | None]] = {}
        self._main = GpuUsageWatch()

    def collect(self) -> Iterator[Metric]:
        memory = GaugeMetricFamily(
            "parley_gpu_memory_bytes",
            "A process's GPU memory (gpu_usage.py): peak_reserved (its torch allocator's "
            "peak), reserved (now), process_peak (the driver's count, its CUDA context "
            "included; sampled), device_peak (the whole device's used memory; sampled), "
            "device_total",
            labels=["process", "measure"],
        )
        readings = {name: read() for name, read in self.processes.items()}
        readings["main"] = self._main.read()
        for name, usage in readings.items():
            for measure, value in (usage.figures() if usage is not None else {}).items():
                memory.add_metric([name, measure], value)
        yield memory


class _RowCollector(Collector):
    """The rows of every watched engine that has a row gate (`Engine.row_load()`; a stage in
    another process reports them with its heartbeat), and how the turns streamed to an
    engine that takes streaming input ended (`StreamingInput.streamed_turns()`), read at
    each scrape."""

    def __init__(self) -> None:
        self.engines: dict[str, Engine] = {}
        self.gates: dict[str, Callable[[], RowLoad]] = {}

    def collect(self) -> Iterator[Metric]:
        in_use = GaugeMetricFamily(
            "parley_stage_rows_in_use", "Cache rows held by requests now", labels=["stage"]
        )
        waiting = GaugeMetricFamily(
            "parley_stage_turns_waiting",
            "Requests waiting for a cache row now (the row gate's queue)",
            labels=["stage"],
        )
        refused = CounterMetricFamily(
            "parley_stage_turns_refused",
            "Requests refused with server_busy: no cache row within their wait, or the "
            "waiting queue full",
            labels=["stage"],
        )
        streamed = CounterMetricFamily(
            "parley_stage_streamed_turns",
            "Turns streamed to the stage while the user spoke, by how they ended: prefilled "
            "(its prefill went on from what was staged), missing (the stage did not have "
            "it, e.g. restarted: taken whole), changed (the turn's request was not what was "
            "streamed: taken whole), failed (staging failed or outgrew the context)",
            labels=["stage", "outcome"],
        )
        for stage, engine in self.engines.items():
            if isinstance(engine, StreamingInput):
                for outcome, count in engine.streamed_turns().items():
                    streamed.add_metric([stage, outcome], count)
        loads = {stage: engine.row_load() for stage, engine in self.engines.items()}
        loads.update((name, load()) for name, load in self.gates.items())
        for stage, load in loads.items():
            if load is None:
                continue
            in_use.add_metric([stage], load.in_use)
            waiting.add_metric([stage], load.waiting)
            refused.add_metric([stage], load.refused)
        yield in_use
        yield waiting
        yield refused
        yield streamed
