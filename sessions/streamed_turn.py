"""The spoken turn in progress, streamed to the pipeline while the user speaks.

A pipeline whose entry engine takes streamed turns (`pipeline.types.StreamsTurns`: the
Qwen3-Omni Thinker) prefills a turn's audio as it arrives, so that the turn's end leaves
only its last part (docs/engines/streamed-prefill.md). Turn-taking opens the turn when the
user's speech becomes the turn (`open`: its item, where its audio begins, prefix padding
included, as the turn's audio will be cut), hands on every frame it hears (`heard`), and
names the turn in the answer's request (`take`), or drops it (`drop`: cleared, committed
by hand, noise, the session ending). A pipeline without the capability is never called,
and every turn is taken whole, as before.

The media path never waits for the pipeline: each call is queued here (bounded) and one
task of this session sends them in order: the turn's context (the request it will be
answered with so far, built from the conversation) and its audio so far from the input
buffer at `open`, then 200 ms of frames a call. A pipeline that falls `MAX_CALLS` behind
loses the turn (dropped; its answer is taken whole), and an answer waits at most
`SETTLE_S` for its turn's calls to be sent before it names the turn: a turn whose calls
failed, or did not go in time, is not named. A request naming a turn that the engine lost
(a restarted stage) is answered whole by the engine, which counts it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from pipeline.tasks import TaskSet
from pipeline.types import Pipeline, PipelineRequest, StreamsTurns, pipeline_streams_turns

from .events import new_id
from .turn_transcript import AudioReader

log = logging.getLogger("parley.sessions.streamed_turn")

FEED_FRAMES = 10
"""Frames a feed call carries (200 ms): the engine stages whole 8 s windows anyway."""
MAX_CALLS = 64
"""Calls waiting to be sent (~13 s of audio); past this the pipeline is behind and the turn
is let go."""
SETTLE_S = 0.5
"""How long an answer waits for its turn's calls to be sent before it names the turn."""

TurnContext = Callable[[str], Awaitable[PipelineRequest]]
"""The request the turn of item `item_id` would be answered with, without its audio."""


@dataclass(frozen=True, slots=True)
class _Turn:
    turn_id: str
    item_id: str
    begin_ms: int
    fed_from_ms: int
    """Frames from here on are fed as they are heard; those before, at the open."""


@dataclass(frozen=True, slots=True)
class _Open:
    turn: _Turn


@dataclass(frozen=True, slots=True)
class _Feed:
    turn_id: str
    pcm: bytes


@dataclass(frozen=True, slots=True)
class _Drop:
    turn_id: str


_Call = _Open | _Feed | _Drop


class TurnStream:
    """One session's streamed turn: at most one open at a time."""

    def __init__(
        self, name: str, pipeline: Pipeline, read_audio: AudioReader, context: TurnContext
    ) -> None:
        self._name = name
        self._pipeline = pipeline
        self._read_audio = read_audio
        self._context = context
        self._turn: _Turn | None = None
        self._taken: _Turn | None = None
        """The turn an answer begun ahead named (it may be moot: `resumed`)."""
        self._frames: list[bytes] = []
        """Heard frames of the open turn not yet in a feed call."""
        self._calls: collections.deque[_Call] = collections.deque()
        self._lost: set[str] = set()
        """Turns whose calls failed or were let go: never named."""
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._tasks = TaskSet(f"{name}:streamed-turn")
        self._sender: asyncio.Task[None] | None = None
        self.opened = 0
        self.named = 0

    @property
    def enabled(self) -> bool:
        """Whether turns are streamed now (the pipeline takes them)."""
        return not self._tasks.closed and pipeline_streams_turns(self._pipeline)

    @property
    def open_item(self) -> str | None:
        """The item of the open turn, if any."""
        return self._turn.item_id if self._turn is not None else None

    def open(self, item_id: str, begin_ms: int, next_frame_ms: int) -> None:
        """The speech `item_id` is the user's turn; its audio begins at `begin_ms`, and the
        frames before `next_frame_ms` are in the input buffer already (the rest will be
        `heard`). Drops the turn open before."""
        self.drop()
        self._taken = None
        self._lost.clear()  # an earlier turn's: never named now
        if not self.enabled:
            return
        turn = _Turn(new_id("turn"), item_id, begin_ms, max(begin_ms, next_frame_ms))
        self._turn = turn
        self.opened += 1
        self._queue(_Open(turn))

    def heard(self, frame: bytes, offset_ms: int) -> None:
        """A 20 ms input frame starting at `offset_ms`, heard by turn-taking."""
        turn = self._turn
        if turn is None or offset_ms < turn.fed_from_ms:
            return
        self._frames.append(frame)
        if len(self._frames) >= FEED_FRAMES:
            pcm, self._frames = b"".join(self._frames), []
            self._queue(_Feed(turn.turn_id, pcm))

    def drop(self) -> None:
        """The open turn, if any, is not answered: the pipeline lets it go."""
        turn, self._turn, self._frames = self._turn, None, []
        if turn is not None:
            self._queue(_Drop(turn.turn_id))

    async def take(self, item_id: str | None, *, ahead: bool = False) -> str:
        """The id of the open turn of `item_id`, for the request of its answer ("" where
        there is none, or its calls failed or were not sent within `SETTLE_S`); the turn
        is no longer open. `ahead`: an answer begun at a pause names it (`resumed`)."""
        turn = self._turn
        if turn is None or item_id is None or turn.item_id != item_id:
            return ""
        self._turn, self._frames = None, []
        try:
            async with asyncio.timeout(SETTLE_S):
                await self._drained.wait()
        except TimeoutError:
            log.info("%s: the pipeline is behind; the turn is answered whole", self._name)
            self._lose(turn.turn_id)
            return ""
        if turn.turn_id in self._lost:
            return ""
        self._taken = turn if ahead else None
        self.named += 1
        return turn.turn_id

    def resumed(self, next_frame_ms: int) -> None:
        """The user spoke on after a pause where an answer begun ahead named the turn (that
        answer is moot, and took the turn with it): the turn is opened again, from its
        audio's beginning."""
        taken, self._taken = self._taken, None
        if taken is not None and self._turn is None:
            self.open(taken.item_id, taken.begin_ms, next_frame_ms)

    async def close(self) -> None:
        """Stop sending (the session ends: the pipeline forgets its turns). Idempotent."""
        self._turn, self._taken, self._frames = None, None, []
        self._calls.clear()
        await self._tasks.close()

    # --- the sender ----------------------------------------------------------------------

    def _queue(self, call: _Call) -> None:
        if self._tasks.closed:
            return
        if isinstance(call, _Feed) and len(self._calls) >= MAX_CALLS:
            log.warning("%s: the pipeline is behind; the turn is answered whole", self._name)
            self._lose(call.turn_id)
            return
        self._calls.append(call)
        self._drained.clear()
        self._wake.set()
        if self._sender is None:
            self._sender = self._tasks.create_task(self._send(), name=f"{self._name}:turn-calls")

    def _lose(self, turn_id: str) -> None:
        """Let the turn go: its calls not sent yet are not, and it is dropped."""
        self._lost.add(turn_id)
        calls = [c for c in self._calls if not (isinstance(c, _Feed) and c.turn_id == turn_id)]
        self._calls = collections.deque(calls)
        if self._turn is not None and self._turn.turn_id == turn_id:
            self._turn, self._frames = None, []
        self._calls.append(_Drop(turn_id))
        self._wake.set()

    async def _send(self) -> None:
        while True:
            if not self._calls:
                self._drained.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            call = self._calls.popleft()
            if not isinstance(call, _Drop) and call_turn(call) in self._lost:
                continue
            try:
                await self._call(call)
            except Exception as exc:  # the answer is taken whole
                log.warning("%s: streaming the turn failed: %r", self._name, exc)
                self._lose(call_turn(call))

    async def _call(self, call: _Call) -> None:
        pipeline = self._pipeline
        assert isinstance(pipeline, StreamsTurns)
        match call:
            case _Open(turn):
                context = await self._context(turn.item_id)
                pcm = await self._read_audio(turn.begin_ms, turn.fed_from_ms)
                passed = await pipeline.open_turn(turn.turn_id, context)
                if passed and len(pcm):
                    passed = await pipeline.feed_turn(turn.turn_id, pcm)
            case _Feed(turn_id, pcm):
                passed = await pipeline.feed_turn(turn_id, np.frombuffer(pcm, dtype=np.int16))
            case _Drop(turn_id):
                await pipeline.drop_turn(turn_id)
                return
        if not passed:  # the pipeline no longer takes turns (its stage went down)
            self._lose(call_turn(call))


def call_turn(call: _Call) -> str:
    """The turn a call is for."""
    return call.turn.turn_id if isinstance(call, _Open) else call.turn_id
