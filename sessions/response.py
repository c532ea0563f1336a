"""One assistant answer: the turn scope.

A `Response` runs as the session's single writer task. It iterates the pipeline, sends
text as events and audio to the sink, and commits the assistant item to the history. When
the turn is cancelled (barge-in, response.cancel, session close) the pipeline iterator is
closed (which aborts the request in every stage) and the item is committed truncated to
the audio the sink reports as played.

A response does not drive the session: it reports what happened (its first audio through
the context, its outcome as the return value of `run()`), and the session makes the state
transitions. What it uses of the session is a `ResponseContext`, fixed when it starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

from pipeline.audio_format import INPUT_SAMPLE_RATE
from pipeline.types import AudioChunk, End, ErrorChunk, Pipeline, PipelineRequest, TextDelta

from .clock import REAL_CLOCK, Clock
from .errors import ParleyError, RedisUnavailableError
from .events import (
    ConversationItem,
    ConversationItemCreated,
    ConversationItemTruncated,
    ErrorEvent,
    Event,
    InputTranscriptionCompleted,
    OutputAudioDelta,
    OutputAudioTranscriptDelta,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
    ResponseStatus,
    ResponseUsage,
    new_id,
)
from .history import History
from .sink import OutputSink
from .spoken_text import SpokenText

log = logging.getLogger("parley.sessions.response")

FINALIZE_TIMEOUT_S = 2.0


RequestBuilder = Callable[[str], Awaitable[PipelineRequest]]
"""Builds the pipeline request of the response with this id (in the response's task)."""


@dataclass(frozen=True, slots=True)
class ResponseContext:
    """What a response uses of its session, as it was when the response started."""

    pipeline: Pipeline
    history: History
    sink: OutputSink
    emit: Callable[[Event], None]
    """Sends a server event to the client (and the event log)."""
    first_audio: Callable[[], None]
    """Reports the answer's first audio, before it is sent (the session starts speaking)."""
    audio_output: bool
    chunk_timeout_s: float
    """Fail when the pipeline sends nothing for this long."""
    clock: Clock = REAL_CLOCK
    """The time the chunk timeout and the latency figures are measured in."""


class Response:
    def __init__(
        self,
        response_id: str,
        context: ResponseContext,
        build_request: RequestBuilder,
        transcript_item_id: str | None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """`transcript_item_id`: the user item that the pipeline's transcript of the
        turn's audio is stored on; `metadata`: the client's, echoed in response.created
        and response.done."""
        self.response_id = response_id
        self.metadata = metadata
        self.request: PipelineRequest | None = None
        self._build_request = build_request
        self.item = ConversationItem(
            id=new_id("item"),
            role="assistant",
            status="in_progress",
            has_audio=context.audio_output,
        )
        self._pipeline = context.pipeline
        self._sink = context.sink
        self._history = context.history
        self._emit = context.emit
        self._first_audio = context.first_audio
        self._user_item_id = transcript_item_id
        self._chunk_timeout_s = context.chunk_timeout_s
        self._clock = context.clock
        self._spoken = SpokenText()
        self._input_transcript: list[str] | None = []
        self._played_base = context.sink.played_ms
        self._started = self._clock.now()
        self._first_text_ms: float | None = None
        self._first_audio_ms: float | None = None
        self.committed = False
        self.cancel_reason = "cancelled"
        self.status: ResponseStatus | None = None
        self.redis_unavailable = False
        """The answer failed because the session store was unreachable; the session tells
        its client about the outage (once), so this response sends no error of its own."""

    @property
    def played_ms(self) -> int:
        return max(0, self._sink.played_ms - self._played_base)

    def _elapsed_ms(self) -> float:
        return (self._clock.now() - self._started) * 1000

    async def run(self) -> ResponseStatus:
        """Answer, commit the item, and once a completed answer has played out, return its
        status. A cancelled response commits what was heard, then re-raises."""
        self._emit(ResponseCreated(response_id=self.response_id, metadata=self.metadata))
        try:
            try:
                previous = await self._history.last_id()
            except Exception:  # Redis down: the item still exists for this connection
                previous = None
            self._emit(ConversationItemCreated(item=self.item, previous_item_id=previous))
            status: ResponseStatus
            error: str | None = None
            try:
                self.request = await self._build_request(self.response_id)
            except RedisUnavailableError as exc:  # this answer fails, the session goes on
                self.redis_unavailable = True
                status, reason = "failed", f"{exc.code}: could not prepare the request: {exc}"
            except Exception as exc:
                log.exception("response %s: could not prepare the request", self.response_id)
                status, reason = "failed", f"could not prepare the request: {exc}"
                error = ParleyError.code
            else:
                status, reason, error = await self._generate(self.request)
        except asyncio.CancelledError:
            await asyncio.wait_for(self._finish_cancelled(), FINALIZE_TIMEOUT_S)
            raise
        if error is not None:  # the client hears of a failure as an error, not only in .done
            self._emit(ErrorEvent(code=error, message=reason, error_type="server_error"))
        await self._finish(status, reason)
        if status == "completed" and self._spoken.audio_ms > 0:
            try:
                await self._sink.drained()
            except asyncio.CancelledError:  # cut off while its last audio was still playing
                await asyncio.wait_for(self._finish_cancelled(), FINALIZE_TIMEOUT_S)
                raise
        return status

    async def _generate(self, request: PipelineRequest) -> tuple[ResponseStatus, str, str | None]:
        """Stream the answer; returns its status, the reason, and an error code if it failed."""
        stream = self._pipeline.generate(request)
        async with aclosing(stream):
            while True:
                try:
                    async with self._clock.timeout(self._chunk_timeout_s):
                        chunk = await anext(stream)
                except TimeoutError:
                    reason = f"the model sent nothing for {self._chunk_timeout_s:g} s"
                    return "failed", reason, "model_timeout"
                except StopAsyncIteration:
                    return "failed", "the pipeline ended without an end marker", "model_error"
                match chunk:
                    case TextDelta(kind="input_transcript"):
                        if self._input_transcript is not None:
                            self._input_transcript.append(chunk.text)
                    case TextDelta():
                        await self._flush_input_transcript()
                        self._on_text(chunk.text)
                    case AudioChunk():
                        await self._flush_input_transcript()
                        await self._on_audio(chunk)
                    case End():
                        await self._flush_input_transcript()
                        return "completed", "", None
                    case ErrorChunk():
                        where = f" in {chunk.stage}" if chunk.stage else ""
                        return "failed", f"model error{where}: {chunk.message}", "model_error"

    def _on_text(self, text: str) -> None:
        if not text:
            return
        if self._first_text_ms is None:
            self._first_text_ms = self._elapsed_ms()
        self._spoken.add_text(text)
        event_type = OutputAudioTranscriptDelta if self.item.has_audio else OutputTextDelta
        self._emit(event_type(response_id=self.response_id, item_id=self.item.id, delta=text))

    async def _on_audio(self, chunk: AudioChunk) -> None:
        if not self.item.has_audio or len(chunk.pcm) == 0:
            return
        if self._first_audio_ms is None:
            self._first_audio_ms = self._elapsed_ms()
            self._first_audio()
        self._spoken.add_audio(chunk.duration_ms)
        self._emit(
            OutputAudioDelta(
                response_id=self.response_id,
                item_id=self.item.id,
                pcm=chunk.pcm.tobytes(),
                sample_rate=chunk.sample_rate,
            )
        )
        await self._sink.audio(chunk.pcm, chunk.sample_rate)

    async def _flush_input_transcript(self) -> None:
        """Store what the user said (the pipeline's speech recognition) on their item."""
        parts, self._input_transcript = self._input_transcript, None
        if not parts or self._user_item_id is None:
            return
        transcript = "".join(parts).strip()
        user_item = await self._history.get(self._user_item_id)
        if user_item is not None:
            user_item.text = transcript
            await self._history.update(user_item)
        self._emit(InputTranscriptionCompleted(item_id=self._user_item_id, transcript=transcript))

    def _usage(self) -> ResponseUsage:
        return ResponseUsage(
            input_audio_ms=len(self.request.audio) * 1000 // INPUT_SAMPLE_RATE
            if self.request
            else 0,
            output_audio_ms=round(self._spoken.audio_ms),
            output_text_chars=len(self._spoken.text),
            first_text_ms=self._first_text_ms,
            first_audio_ms=self._first_audio_ms,
            total_ms=self._elapsed_ms(),
        )

    async def _finish(self, status: ResponseStatus, reason: str) -> None:
        self.status = status
        self.item.status = "completed" if status == "completed" else "incomplete"
        self.item.text = self._spoken.text.strip()
        self.item.audio_ms = round(self._spoken.audio_ms)
        if self.item.text or self.item.audio_ms:
            await self._history.append(self.item)
            self.committed = True
        if status == "failed" and not self.redis_unavailable:  # an outage is logged once
            log.warning("response %s failed: %s", self.response_id, reason)
        self._emit(
            ResponseDone(
                response_id=self.response_id,
                status=status,
                reason=reason,
                item=self.item,
                usage=self._usage(),
                metadata=self.metadata,
            )
        )

    async def _finish_cancelled(self) -> None:
        """Runs in the cancelled task: the sink was already cleared by the canceller."""
        if self.status is None:  # still generating: the response itself is cancelled
            await self._finish("cancelled", self.cancel_reason)
        if self.item.has_audio and self._spoken.audio_ms > 0:
            await self.truncate(self.played_ms)

    async def truncate(self, audio_end_ms: int) -> None:
        """Cut the committed item to what was heard, and say so."""
        audio_end_ms = min(audio_end_ms, round(self._spoken.audio_ms))
        self.item.text = self._spoken.heard(audio_end_ms)
        self.item.audio_ms = audio_end_ms
        self.item.status = "incomplete"
        if self.committed:
            await self._history.update(self.item)
        elif self.item.text or audio_end_ms:
            await self._history.append(self.item)
            self.committed = True
        self._emit(ConversationItemTruncated(item_id=self.item.id, audio_end_ms=audio_end_ms))
