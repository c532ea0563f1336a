"""A full-duplex model's own turns, told as the session's responses.

A duplex model (pipeline/duplex.py) hears the microphone continuously and speaks whenever
it decides to: there is no request per turn. The session's protocols are built on
responses (OpenAI Realtime's `response.created` ... `response.done`, the items, the
truncation of what was heard), so the model's speech is cut into turns here, by its own
voice: a turn begins with the first frame it voices after being quiet, and ends when it has
been quiet for `QUIET_FRAMES` (it yielded). Each turn is a `Response` of the session whose
pipeline is a `DuplexTurn`: the frames of that turn as audio chunks, then `End`. So the
events, the playout, the history and the truncation are the ones every answer has.

Nothing asks the model to speak or to stop, as nothing can: a cancelled turn
(`response.cancel`, `output_audio_buffer.clear`) closes its `DuplexTurn`, and what the model
goes on saying is dropped until it has been quiet again, so the client hears silence at
once and the next turn is the model's next utterance.

`DuplexTurns` owns the session's stream: `open` takes a place on the model (DuplexFull when
it holds all it can), `run` is the reader, which the session's task group owns, and `close`
gives the place back (idempotent).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

import numpy as np

from pipeline.audio_format import INPUT_SAMPLE_RATE
from pipeline.capacity import PipelineCapacity
from pipeline.duplex import (
    DUPLEX_RATE,
    DuplexFailed,
    DuplexFrame,
    DuplexFull,
    DuplexModel,
    DuplexStream,
    duplex_model,
)
from pipeline.types import AudioChunk, End, OutputChunk, PipelineRequest, TextDelta

from .errors import SessionLimitError
from .resample import OutputResampler

log = logging.getLogger("parley.sessions.duplex")

VOICED_RMS = 300.0
"""A frame louder than this (RMS of PCM16, about -40 dBFS) is the model speaking."""

QUIET_FRAMES = 8
"""The model has yielded after this many quiet frames in a row (640 ms at 80 ms a frame)."""

TURN_BACKLOG = 64
"""Frames a turn holds that its response has not taken yet (5 s); past that they are
dropped and counted: the frame clock never waits for a slow consumer."""


def voiced(frame: DuplexFrame) -> bool:
    """Whether the model says something in this frame: words, or sound above the floor."""
    if getattr(frame, "words", ""):
        return True
    pcm = frame.pcm.astype(np.float32)
    return bool(len(pcm)) and float(np.sqrt(np.mean(pcm * pcm))) > VOICED_RMS


class DuplexTurn:
    """One turn of the model's speech, as a pipeline that a `Response` runs: the turn's
    frames as chunks at the response's rate, then `End` when the model yields."""

    name = "duplex"

    def __init__(self) -> None:
        self._frames: asyncio.Queue[DuplexFrame | None] = asyncio.Queue(TURN_BACKLOG)
        self.ended = False
        """The model yielded: nothing more is put."""
        self.closed = False
        """Its response stopped taking frames (ended, or cancelled before the model yielded)."""
        self.dropped = 0

    def put(self, frame: DuplexFrame) -> None:
        if self.closed or self.ended:
            return
        try:
            self._frames.put_nowait(frame)
        except asyncio.QueueFull:
            self.dropped += 1

    def end(self) -> None:
        """The model yielded: the response ends after the frames it has."""
        if self.ended:
            return
        self.ended = True
        try:
            self._frames.put_nowait(None)
        except asyncio.QueueFull:  # the response is that far behind: it ends at the backlog
            self._frames.get_nowait()
            self._frames.put_nowait(None)
            self.dropped += 1

    async def generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]:
        rate = request.output_sample_rate
        resampler = OutputResampler(DUPLEX_RATE, rate) if rate != DUPLEX_RATE else None
        try:
            while (frame := await self._frames.get()) is not None:
                words: str = getattr(frame, "words", "")
                if words:
                    yield TextDelta(words)
                pcm = frame.pcm if resampler is None else resampler.push(frame.pcm)
                yield AudioChunk(pcm, rate)
            if resampler is not None:
                yield AudioChunk(resampler.flush(), rate)
            yield End()
        finally:
            self.closed = True

    # the rest of the Pipeline protocol: a turn has no life of its own
    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True

    def active_requests(self) -> int:
        return 0 if self.closed else 1

    async def forget_session(self, session_id: str) -> None:
        return None

    def capacity(self) -> PipelineCapacity | None:
        """A duplex turn is served by the session's own stream: no capacity of its own."""
        return None


class DuplexTurns:
    """A session's stream on a duplex model, and the model's turns on it."""

    def __init__(self, model: DuplexModel, stream: DuplexStream, session_id: str) -> None:
        self._model = model
        self.stream = stream
        self.session_id = session_id
        self._up = OutputResampler(INPUT_SAMPLE_RATE, DUPLEX_RATE)
        self._turn: DuplexTurn | None = None
        self._quiet = 0
        self._hushed = False
        """A turn was cancelled: the model's voice is dropped until it is quiet again."""
        self._closed = False
        self.turns = 0

    @classmethod
    def open(cls, model: DuplexModel, session_id: str) -> DuplexTurns:
        """A place on the model for the session; DuplexFull when it holds all it can."""
        return cls(model, model.open(session_id), session_id)

    @classmethod
    def on(cls, pipeline: object, session_id: str) -> DuplexTurns | None:
        """The session's place on the pipeline's duplex model, None when it has none;
        SessionLimitError when the model holds all the sessions it can (as a full server
        refuses a session: the transports say so in their own words)."""
        model = duplex_model(pipeline)
        if model is None:
            return None
        try:
            return cls.open(model, session_id)
        except DuplexFull as exc:
            raise SessionLimitError(str(exc)) from None

    def hear(self, frames: list[bytes]) -> None:
        """The session's input frames (PCM16 at the input rate) to the model, as they come."""
        if self._closed or not frames:
            return
        pcm = np.frombuffer(b"".join(frames), dtype="<i2").astype(np.int16)
        self.stream.feed(self._up.push(pcm))

    async def run(
        self,
        speak: Callable[[DuplexTurn], Awaitable[None]],
        failed: Callable[[str], None] | None = None,
    ) -> None:
        """Read the model's voice until the stream ends; `speak` starts a turn's response,
        `failed` is told why when the model failed under the session (its clock died or
        stalled, or its own input failed); the session then ends, which cancels the turn
        being said."""
        try:
            async for frame in self.stream.frames():
                await self._on_frame(frame, speak)
        except DuplexFailed as exc:
            log.warning("session %s: the duplex model failed: %s", self.session_id, exc)
            if failed is not None:
                failed(str(exc))

    async def _on_frame(
        self, frame: DuplexFrame, speak: Callable[[DuplexTurn], Awaitable[None]]
    ) -> None:
        loud = voiced(frame)
        self._quiet = 0 if loud else self._quiet + 1
        turn = self._turn
        if turn is not None and turn.closed and not turn.ended:
            self._turn, turn = None, None  # cancelled while the model spoke on
            self._hushed = True
        if self._hushed:
            self._hushed = self._quiet < QUIET_FRAMES
            return
        if turn is None:
            if not loud:
                return
            turn = self._turn = DuplexTurn()
            self.turns += 1
            turn.put(frame)
            await speak(turn)
            return
        turn.put(frame)
        if self._quiet >= QUIET_FRAMES:
            turn.end()
            if turn.dropped:
                log.warning("session %s: %d frames dropped", self.session_id, turn.dropped)
            self._turn = None

    def close(self) -> None:
        """Give the session's place on the model back (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._turn is not None:
            self._turn.end()
        self._model.leave(self.session_id)
