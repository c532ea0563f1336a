"""The stage graph runtime: one request in, streamed output chunks out.

Every stage of a request runs as its own task, owned by `generate`. Entry stages (no upstream
edge; their engine is an EntryEngine, checked when the graph is built) get the request; every
other stage (a StreamEngine) gets a `StageInput` whose chunk stream is fed by its upstream
stages through one bounded channel, so a downstream stage starts on the first chunk its
upstream yields and a slow consumer holds back everything upstream instead of growing a
queue. Closing the output iterator (or cancelling its reader) cancels every stage task, and
each engine aborts the request when its generator is cancelled: afterwards no stage holds
state for it. An error in any stage reaches the caller as one ErrorChunk and stops the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .capacity import PipelineCapacity, StageCapacity
from .channel import Channel, ChannelClosed
from .gpu_sharing import MpsDaemon
from .graph_admission import STAGE as GRAPH_ROWS
from .graph_admission import GraphAdmission
from .graph_config import (
    EdgeConfig,
    GraphConfig,
    GraphConfigError,
    StageConfig,
    resolve_transform,
    wrong_engine_kind,
)
from .metrics import PipelineMetrics, RequestKind
from .streamed_entry import PassesStreamedTurns, turn_engine
from .tasks import TaskSet
from .types import (
    AudioChunk,
    Chunk,
    End,
    Engine,
    EntryEngine,
    ErrorChunk,
    OutputChunk,
    PipelineRequest,
    StageInput,
    StreamEngine,
    StreamingInput,
    TextDelta,
    ToolCallDelta,
)

log = logging.getLogger("parley.pipeline.graph")

DEFAULT_CHANNEL_SIZE = 16


@dataclass(frozen=True, slots=True)
class _StageDone:
    stage: str


@dataclass
class _Edge:
    config: EdgeConfig
    transform: Callable[[Sequence[Chunk]], Sequence[Chunk]] | None


class StageGraph(PassesStreamedTurns):
    """A Pipeline made of engines wired by a GraphConfig.

    Raises GraphConfigError, naming the stage, when an engine is not the kind its stage
    needs (an EntryEngine where there is no upstream edge, a StreamEngine elsewhere).
    `gpu`: the MPS daemon the graph's stage processes share a GPU through (`gpu_sharing:
    mps`), started before the first engine and quit after the last one closes."""

    def __init__(
        self,
        config: GraphConfig,
        engines: dict[str, Engine],
        *,
        channel_size: int = DEFAULT_CHANNEL_SIZE,
        metrics: PipelineMetrics | None = None,
        gpu: MpsDaemon | None = None,
    ) -> None:
        missing = [s.name for s in config.stages if s.name not in engines]
        if missing:
            raise ValueError(f"no engine for stage(s): {', '.join(missing)}")
        self.config = config
        self.name = config.name
        self.engines = engines
        self.channel_size = channel_size
        self.metrics = metrics or PipelineMetrics()
        self.gpu = gpu
        self.admission: GraphAdmission | None = None
        """One row per turn in the whole graph (`graph_admission.py`), set once started."""
        self._entry: dict[str, EntryEngine] = {}
        self._stream: dict[str, StreamEngine] = {}
        for index, stage in enumerate(config.stages):
            match config.stage_kind(stage.name), engines[stage.name]:
                case "entry", EntryEngine() as entry:
                    self._entry[stage.name] = entry
                case "stream", StreamEngine() as stream:
                    self._stream[stage.name] = stream
                case kind, engine:
                    raise GraphConfigError(
                        f"graph {config.name}",
                        None,
                        f"stages.{index}.engine",
                        wrong_engine_kind(stage.name, kind, engine),
                    )
        self._outputs = set(config.outputs)
        self._edges_from: dict[str, list[_Edge]] = {s.name: [] for s in config.stages}
        for edge in config.edges:
            transform = resolve_transform(edge.transform) if edge.transform else None
            self._edges_from[edge.source].append(_Edge(edge, transform))
        for stage in config.stages:
            self.metrics.watch_engine(stage.name, engines[stage.name])

    async def start(self) -> None:
        """Start every engine; if one fails, close those that started and raise its error.

        Stages on a GPU start one after another, in the file's order: each sizes its cache
        rows from the memory the ones before it left (`pipeline/memory_plan.py`). A graph
        wholly on CPUs starts each worker (or remote) stage beside the others: a worker's
        start is mostly its own process importing torch and loading its model, and one
        after another they added up (the tiny Qwen3-Omni's two workers: 8 s, then 8.6 s).
        The stages in this process still start one after another, in one lane: a model
        built from seeded random weights draws from the process's one random generator,
        and two built at once would each get the other's numbers."""
        started: list[Engine] = []
        if self.gpu is not None:
            await asyncio.to_thread(self.gpu.start)

        async def start(engine: Engine) -> None:
            await engine.start()
            started.append(engine)

        async def start_in_turn(engines: list[Engine]) -> None:
            for engine in engines:
                await start(engine)

        stages = self.config.stages
        lanes: list[list[Engine]] = [[]]  # this process's stages, then one lane per process
        for stage in stages:
            engine = self.engines[stage.name]
            if stage.placement.process == "main":
                lanes[0].append(engine)
            else:
                lanes.append([engine])
        if any(device != "cpu" for stage in stages for device in stage.devices):
            lanes = [[self.engines[stage.name] for stage in stages]]
        try:  # each lane runs to its end (no start is cancelled halfway); then the first error
            results = await asyncio.gather(
                *(start_in_turn(lane) for lane in lanes), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        except BaseException:
            for engine in reversed(started):
                await engine.close()
            if self.gpu is not None:
                await asyncio.to_thread(self.gpu.close)
            raise
        self.admission = GraphAdmission.of(self.capacity())
        self.metrics.watch_rows(GRAPH_ROWS, self.admission.load if self.admission else None)

    async def close(self) -> None:
        """Close every engine at once (worker shutdowns overlap); idempotent."""
        if self.admission is not None:
            self.admission.close()
        results = await asyncio.gather(
            *(engine.close() for engine in self.engines.values()), return_exceptions=True
        )
        for stage, result in zip(self.engines, results, strict=True):
            if isinstance(result, BaseException):
                log.error("stage %s did not close cleanly: %r", stage, result)
        if self.gpu is not None:
            await asyncio.to_thread(self.gpu.close)

    def active_requests(self) -> int:
        return sum(engine.active_requests() for engine in self.engines.values())

    def capacity(self) -> PipelineCapacity | None:
        """What the started graph can serve: each stage's engine's figures under the
        stage's name (a replicated stage's summed over its replicas; a stage served to
        every server process marked shared), the sessions the smallest allows."""
        found = []
        for stage in self.config.stages:
            if (figures := stage_capacity(stage.name, self.engines[stage.name])) is not None:
                found.append(figures)
        return PipelineCapacity.of(found)

    def stalled_stages(self) -> dict[str, str]:
        """Per stage that cannot serve now (hung, or its process restarting): why."""
        found: dict[str, str] = {}
        for stage in self.config.stages:
            if (reason := self.engines[stage.name].stalled(stage.hang_s)) is not None:
                found[stage.name] = reason
        return found

    def broken_stages(self) -> dict[str, str]:
        """Per stage broken for good in this process (`Engine.broken`: a sticky device
        error of a stage placed in the main process): why. The process must exit to
        recover (`web/broken_stages.py`); a stage in a process of its own is never here
        (that process exits, and its supervisor restarts it)."""
        found: dict[str, str] = {}
        for stage in self.config.stages:
            if (reason := self.engines[stage.name].broken()) is not None:
                found[stage.name] = reason
        return found

    async def forget_session(self, session_id: str) -> None:
        """Every stage drops what it kept for the session (all at once, like close)."""
        results = await asyncio.gather(
            *(engine.forget_session(session_id) for engine in self.engines.values()),
            return_exceptions=True,
        )
        for stage, result in zip(self.engines, results, strict=True):
            if isinstance(result, BaseException):
                log.error("stage %s did not forget session %s: %r", stage, session_id, result)

    def _turn_engine(self) -> StreamingInput | None:
        """A turn streamed while the user speaks goes to the graph's entry stage, if there
        is one and its engine takes streamed turns (`streamed_entry.py`)."""
        if len(self._entry) != 1:
            return None
        return turn_engine(next(iter(self._entry.values())))

    async def generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]:
        admission = None if request.transcribe_only else self.admission
        if admission is not None:
            entered = await admission.enter(request.request_id)
            if entered is not True:
                if isinstance(entered, ErrorChunk):
                    yield entered
                return
        try:
            async with contextlib.aclosing(self._generate(request)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            if admission is not None:
                admission.leave(request.request_id)

    async def _generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]:
        out: Channel[OutputChunk | _StageDone] = Channel(self.channel_size)
        inputs: dict[str, Channel[Chunk]] = {}
        open_upstreams: dict[str, int] = {}
        for stage in self.config.stages:
            if stage.name not in self._entry:
                inputs[stage.name] = Channel(self.channel_size)
                open_upstreams[stage.name] = len(self.config.upstream(stage.name))
        # a TaskSet and not a TaskGroup: its scope spans this generator's yields
        tasks = TaskSet(request.request_id)
        for stage in self.config.stages:
            tasks.create_task(
                self._run_stage(stage, request, inputs, open_upstreams, out),
                name=f"{request.request_id}:{stage.name}",
            )
        pending_outputs = set(self._outputs)
        try:
            while pending_outputs:
                item = await out.recv()
                if isinstance(item, _StageDone):
                    pending_outputs.discard(item.stage)
                    continue
                yield item
                if isinstance(item, ErrorChunk):
                    return
            yield End()
        finally:
            out.discard()
            for channel in inputs.values():
                channel.discard()
            await tasks.close()

    async def _run_stage(
        self,
        stage: StageConfig,
        request: PipelineRequest,
        inputs: dict[str, Channel[Chunk]],
        open_upstreams: dict[str, int],
        out: Channel[OutputChunk | _StageDone],
    ) -> None:
        name = stage.name
        edges = self._edges_from[name]
        batches: list[list[Chunk]] = [[] for _ in edges]
        started = time.monotonic()
        first = True
        kind: RequestKind = "transcription" if request.transcribe_only else "answer"
        try:
            if name in self._entry:
                stream = self._entry[name].generate(request.request_id, request)
            else:
                upstream = StageInput(request, aiter(inputs[name]))
                stream = self._stream[name].generate(request.request_id, upstream)
            try:
                async for chunk in stream:
                    if first and not isinstance(chunk, End | ErrorChunk):  # output, not a stop
                        self.metrics.first_chunk(name, kind, time.monotonic() - started)
                        first = False
                    if isinstance(chunk, ErrorChunk):
                        await out.send(ErrorChunk(chunk.message, chunk.stage or name, chunk.code))
                        return
                    if isinstance(chunk, End):
                        break
                    self.metrics.chunk(name)
                    if isinstance(chunk, ToolCallDelta):  # for the client: no stage takes it
                        await out.send(chunk)
                        continue
                    if name in self._outputs and isinstance(chunk, TextDelta | AudioChunk):
                        await out.send(chunk)
                    for edge, batch in zip(edges, batches, strict=True):
                        batch.append(chunk)
                        if len(batch) >= edge.config.chunk:
                            await self._forward(edge, batch, inputs)
                            batch.clear()
            finally:
                await stream.aclose()
            for edge, batch in zip(edges, batches, strict=True):
                if batch:
                    await self._forward(edge, batch, inputs)
            if name in self._outputs:
                await out.send(_StageDone(name))
        except ChannelClosed:
            return  # the request is being torn down
        except Exception as exc:
            log.exception("stage %s failed on %s", name, request.request_id)
            await _send_quietly(out, ErrorChunk(f"{type(exc).__name__}: {exc}", name))
        finally:
            if name in inputs:
                inputs[name].discard()  # unblock upstreams if this stage stopped reading early
            for edge in edges:
                target = edge.config.target
                open_upstreams[target] -= 1
                if open_upstreams[target] == 0:
                    inputs[target].close()

    async def _forward(
        self, edge: _Edge, batch: list[Chunk], inputs: dict[str, Channel[Chunk]]
    ) -> None:
        channel = inputs[edge.config.target]
        produced = edge.transform(batch) if edge.transform else batch
        try:
            for chunk in produced:
                await channel.send(chunk)
        except ChannelClosed:
            return  # the downstream stage has finished and reads no more
        self.metrics.queue_depth(edge.config.target, len(channel))


def stage_capacity(stage: str, engine: Engine) -> StageCapacity | None:
    """A stage's figures as its engine states them (`Engine.capacity()`), or None."""
    capacity = engine.capacity()
    if capacity is None:
        return None
    return StageCapacity(
        dataclasses.replace(capacity, stage=stage), shared=engine.shared_by_processes()
    )


async def _send_quietly(out: Channel[Any], item: Any) -> None:
    with contextlib.suppress(ChannelClosed):
        await out.send(item)
