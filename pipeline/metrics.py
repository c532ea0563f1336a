"""Per-stage instruments: time to first chunk, chunks, queue depth, batch size."""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .types import Engine

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

    def watch_engine(self, stage: str, engine: Engine) -> None:
        self._batch.labels(stage).set_function(lambda: float(getattr(engine, "batch_size", 0)))
        self._active.labels(stage).set_function(lambda: float(engine.active_requests()))

    def first_chunk(self, stage: str, kind: RequestKind, seconds: float) -> None:
        """Once per request that a stage produced output for: a transcription-only
        request (a user turn no answer follows yet) is its own kind, and one that ended
        without output (the Talker's share of a transcription) is none."""
        self._ttfc.labels(stage, kind).observe(seconds)

    def chunk(self, stage: str) -> None:
        self._chunks.labels(stage).inc()

    def queue_depth(self, stage: str, depth: int) -> None:
        self._depth.labels(stage).set(depth)
