"""Small scripted engines for stage-graph tests; they obey the engine contract."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncGenerator, Iterator

import numpy as np

from pipeline.capacity import Capacity, Holds, RowLoad
from pipeline.engines.echo import EchoEngine
from pipeline.requests import RequestTracker, TracksRequests
from pipeline.step_watch import StepWatch
from pipeline.types import (
    AudioChunk,
    Chunk,
    End,
    Engine,
    EntryEngine,
    ErrorChunk,
    PipelineRequest,
    StageInput,
    StreamEngine,
    StreamingInput,
    TextDelta,
)


class Scripted(TracksRequests, Engine):
    """What the two scripted stages share: settings, counters and per-request state.

    `emit` picks what a stage yields: "text" (upper-cased text) or "audio" (an AudioChunk
    whose length encodes the text). Every chunk records its time, so tests can see that a
    downstream stage started before its upstream finished.
    """

    def __init__(
        self,
        name: str,
        count: int = 5,
        delay_s: float = 0.0,
        emit: str = "text",
        fail_at: int | None = None,
    ) -> None:
        self.name = name
        self.count = count
        self.delay_s = delay_s
        self.emit = emit
        self.fail_at = fail_at
        self.produced = 0
        self.first_input_at: float | None = None
        self.finished_at: float | None = None
        self.stopped_early: list[str] = []
        self._requests: RequestTracker[None] = RequestTracker()

    @contextlib.contextmanager
    def _running(self, request_id: str) -> Iterator[None]:
        """Hold the request while its stream runs; note a stream closed or cancelled early."""
        try:
            with self._requests.track(request_id):
                yield
        except (asyncio.CancelledError, GeneratorExit):
            self.stopped_early.append(request_id)
            raise

    async def _make(self, source: Chunk, index: int) -> Chunk:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if index == self.fail_at:
            return ErrorChunk(message=f"{self.name} broke at chunk {index}")
        self.produced += 1
        text = source.text if isinstance(source, TextDelta) else f"a{index}"
        if self.emit == "audio":
            return AudioChunk(pcm=np.full(len(text), index, dtype=np.int16), sample_rate=24_000)
        return TextDelta(text=text.upper())


class ScriptedEntry(Scripted, EntryEngine):
    """An entry stage: yields `count` text deltas ("W0 ", "W1 ", ...)."""

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        with self._running(request_id):
            for i in range(self.count):
                yield await self._make(TextDelta(text=f"w{i} "), i)
            self.finished_at = time.monotonic()
            yield End()


class ScriptedStage(Scripted, StreamEngine):
    """A stream stage: maps each upstream chunk to one chunk."""

    async def generate(self, request_id: str, inputs: StageInput) -> AsyncGenerator[Chunk, None]:
        with self._running(request_id):
            i = 0
            async for chunk in inputs.chunks:
                if self.first_input_at is None:
                    self.first_input_at = time.monotonic()
                yield await self._make(chunk, i)
                i += 1
            self.finished_at = time.monotonic()
            yield End()


class Relay(TracksRequests, StreamEngine):
    """Downstream: passes every upstream chunk on, `delay_s` late each (a slow stage).

    It keeps per-request state until the request ends or is aborted, so tests can see
    that an interrupted answer leaves nothing behind in a middle stage."""

    name = "relay"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.relayed = 0
        self._requests: RequestTracker[None] = RequestTracker()

    async def generate(self, request_id: str, inputs: StageInput) -> AsyncGenerator[Chunk, None]:
        with self._requests.track(request_id):
            async for chunk in inputs.chunks:
                if self._requests.aborted(request_id):
                    return
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                self.relayed += 1
                yield chunk


class Sticking(TracksRequests, EntryEngine):
    """An entry stage whose steps run on a model thread of its own, as a real engine's do:
    `count` steps of `step_s` each, a text delta after each. For a request whose text is
    "stick" the `stick_at`-th step never returns (a kernel that hangs), while the event
    loop lives on; `close` lets it go."""

    name = "sticking"

    def __init__(self, count: int = 20, step_s: float = 0.02, stick_at: int = 3) -> None:
        self.count = count
        self.step_s = step_s
        self.stick_at = stick_at
        self.watch = StepWatch("the sticking thread")
        self._release = threading.Event()
        self._requests: RequestTracker[None] = RequestTracker()

    def stalled(self, bound_s: float) -> str | None:
        return self.watch.stalled(bound_s)

    async def close(self) -> None:
        self._release.set()
        self._requests.clear()

    def _step(self, stick: bool) -> None:
        with self.watch.busy():
            if stick:
                self._release.wait()
            else:
                time.sleep(self.step_s)

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        with self._requests.track(request_id):
            for i in range(self.count):
                await asyncio.to_thread(self._step, request.text == "stick" and i == self.stick_at)
                yield TextDelta(text=f"S{i} ")
            yield End()


class WhereAmI(TracksRequests, EntryEngine):
    """An entry stage that says where it runs, as a replica on `device` would: one text delta,
    "<device> <pid> <sessions it keeps state for, comma-separated>", then End. It keeps a
    session from its first request until `forget_session` (as a Thinker keeps its KV). With
    `hold` in a request's text it waits until aborted or closed."""

    name = "where"

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.sessions: set[str] = set()
        self._requests: RequestTracker[None] = RequestTracker()

    async def forget_session(self, session_id: str) -> None:
        self.sessions.discard(session_id)

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        with self._requests.track(request_id):
            if request.session_id:
                self.sessions.add(request.session_id)
            kept = ",".join(sorted(self.sessions))
            yield TextDelta(text=f"{self.device} {os.getpid()} {kept}")
            while request.text == "hold" and not self._requests.aborted(request_id):
                await asyncio.sleep(0.01)
            yield End()


class Breaking(TracksRequests, EntryEngine):
    """An entry stage whose steps run on a real `ModelThread`, as the Qwen3-Omni stages' do:
    `count` steps of `step_s`, a text delta after each. A step can be made to fail with a
    sticky device error through the model thread's test hook (`device_faults.INJECT_ENV`):
    then the engine is broken, as after a device-side assert on a GPU."""

    name = "breaking"

    def __init__(self, count: int = 10, step_s: float = 0.01) -> None:
        from pipeline.engines.qwen3_omni.model_thread import ModelThread

        self.count = count
        self.step_s = step_s
        self.thread = ModelThread("parley-breaking")
        self._requests: RequestTracker[None] = RequestTracker()

    async def start(self) -> None:
        self.thread.start()

    def broken(self) -> str | None:
        return self.thread.fatal

    def stalled(self, bound_s: float) -> str | None:
        broken = self.broken()
        return f"broken: {broken}" if broken else self.thread.watch.stalled(bound_s)

    async def close(self) -> None:
        self._requests.clear()
        await self.thread.close()

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        with self._requests.track(request_id):
            for i in range(self.count):
                await self.thread.call(time.sleep, self.step_s)
                yield TextDelta(text=f"B{i} ")
            yield End()


class Rowed(EchoEngine):
    """The echo engine stating a capacity, as a GPU engine with `rows` cache rows would
    (`holds` "session": a duplex model's; "turn": `waiting` more turns may wait); `shared`:
    as if one served every server process (a stage host's)."""

    name = "rowed"

    def __init__(
        self, rows: int = 2, holds: Holds = "session", waiting: int = 0, shared: bool = False
    ) -> None:
        super().__init__()
        self.figures = Capacity(self.name, rows, 4096, holds, waiting=waiting, wait_s=1.0)
        self.shared = shared
        """As a stage host's: one engine for every server process."""

    def capacity(self) -> Capacity:
        return self.figures

    def shared_by_processes(self) -> bool:
        return self.shared

    def row_load(self) -> RowLoad:
        return RowLoad(in_use=self.active_requests())


class StreamedEntry(TracksRequests, EntryEngine, StreamingInput):
    """An entry stage that takes streamed turns as a Thinker does, and says what it got: a
    request naming a turn it has answers "prefilled <session> <samples fed> <pid>", one
    naming a turn it lacks "missing ... <pid>", any other "whole <pid>"; each outcome is
    counted (`streamed_turns`) as the Thinker counts its own."""

    name = "streamed"

    def __init__(self) -> None:
        self.turns: dict[str, tuple[str, int]] = {}
        """per open turn: its session and the samples fed so far"""
        self.counts = {"prefilled": 0, "missing": 0}
        self._requests: RequestTracker[None] = RequestTracker()

    async def open_turn(self, turn_id: str, context: PipelineRequest) -> None:
        for other, (session, _) in list(self.turns.items()):
            if session == context.session_id:  # one open turn a session
                del self.turns[other]
        self.turns[turn_id] = (context.session_id, 0)

    async def feed_turn(self, turn_id: str, pcm: np.ndarray) -> None:
        if turn_id in self.turns:
            session, samples = self.turns[turn_id]
            self.turns[turn_id] = (session, samples + len(pcm))

    async def drop_turn(self, turn_id: str) -> None:
        self.turns.pop(turn_id, None)

    async def forget_session(self, session_id: str) -> None:
        for turn_id, (session, _) in list(self.turns.items()):
            if session == session_id:
                del self.turns[turn_id]

    def streamed_turns(self) -> dict[str, int]:
        return dict(self.counts)

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        with self._requests.track(request_id):
            said = "whole"
            if request.streamed_turn:
                turn = self.turns.pop(request.streamed_turn, None)
                said = "missing" if turn is None else f"prefilled {turn[0]} {turn[1]}"
                self.counts[said.split()[0]] += 1
            yield TextDelta(text=f"{said} {os.getpid()}")
            yield End()
