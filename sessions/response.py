"""One assistant answer: the turn scope.

A `Response` runs as the session's single writer task. It iterates the pipeline, sends
text as events and audio to the sink, and commits the assistant item to the history. When
the turn is cancelled (barge-in, response.cancel, session close) the pipeline iterator is
closed (which aborts the request in every stage) and the item is committed truncated to
the audio the sink reports as played.

An answer's output items appear as the model makes them: the message item with its first
text or audio, a `function_call` item with the first piece of a call's arguments. A
response that only calls a tool has no message item. With `parallel_tool_calls` off, only
the first call of each round of the model's writing is kept. Function calls are committed
to the history when complete; the client runs them and sends their output as items. An
out-of-band response (`conversation: "none"`) commits nothing.

A response does not drive the session: it reports what happened (its first audio through
the context, its outcome as the return value of `run()`), and the session makes the state
transitions. What it uses of the session is a `ResponseContext`, fixed when it starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace

from pipeline.audio_format import INPUT_SAMPLE_RATE
from pipeline.types import (
    AudioChunk,
    End,
    ErrorChunk,
    Logprobs,
    Pipeline,
    PipelineRequest,
    TextDelta,
    ToolCallDelta,
)

from .clock import REAL_CLOCK, Clock
from .errors import ParleyError, RedisUnavailableError
from .events import (
    CLIENT_ERRORS,
    ConversationItem,
    ConversationItemCreated,
    ConversationItemTruncated,
    ErrorEvent,
    Event,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
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
from .mcp_calls import McpCalls
from .mcp_history import MCP_ROUNDS, follow_up
from .mcp_tools import McpTools
from .prefetch import Prefetch
from .response_options import ResolvedOptions
from .sink import OutputSink
from .spoken_text import SpokenText
from .transcription import Heard

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
    chunk_timeout_s: float
    """Fail when the pipeline sends nothing for this long."""
    clock: Clock = REAL_CLOCK
    """The time the chunk timeout and the latency figures are measured in."""
    mcp: McpTools | None = None
    """The session's MCP servers: their tools' calls run in the response (mcp_calls.py)."""


class Response:
    def __init__(
        self,
        response_id: str,
        context: ResponseContext,
        build_request: RequestBuilder,
        transcript_item_id: str | None,
        options: ResolvedOptions,
        prefetched: Prefetch | None = None,
        heard: Heard | None = None,
    ) -> None:
        """`transcript_item_id`: the user item that the pipeline's transcript of the
        turn's audio is stored on; `options`: the response's settings (its metadata is
        echoed in response.created and response.done)."""
        self.response_id = response_id
        self.options = options
        self.metadata = options.metadata
        self.request: PipelineRequest | None = None
        self._build_request = build_request
        self._prefetched = prefetched
        """Work begun at the turn's pause, which this response adopts (prefetch.py)."""
        self.item = ConversationItem(
            id=new_id("item"),
            role="assistant",
            status="in_progress",
            has_audio=options.audio_output,
        )
        """The answer's message item; announced with its first text or audio."""
        self._announced = False
        self.calls: list[ConversationItem] = []
        """The function calls (and MCP calls and approval requests) made so far, in order."""
        self._mcp = (
            None
            if context.mcp is None
            else McpCalls(
                context.mcp,
                response_id,
                context.history,
                context.emit,
                self._previous_id,
                self.calls,
                options.tools,
                options.in_conversation,
            )
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
        self._heard_words = ""
        self._input_transcript: list[str] | None = []
        self._input_logprobs: Logprobs | None = None
        """The transcript's tokens so far, if the recogniser gives them (as asked)."""
        self._heard_already = False
        """The turn's words were recognised before (at its pause): the engine's own
        transcript, if it sends one, is not announced again."""
        if heard is not None:
            self._heard_before(heard.words, heard.logprobs)
        self._played_base = context.sink.played_ms
        self._started = self._clock.now()
        self._first_text_ms: float | None = None
        self._first_audio_ms: float | None = None
        self.committed = False
        self.cancel_reason = "cancelled"
        self.status: ResponseStatus | None = None
        self._handed_over = False
        self._client_cut_ms: int | None = None
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
        self._emit(
            ResponseCreated(
                response_id=self.response_id,
                metadata=self.metadata,
                in_conversation=self.options.in_conversation,
                audio_output=self.options.audio_output,
                max_output_tokens=self.options.max_output_tokens,
            )
        )
        try:
            status: ResponseStatus
            error: str | None = None
            try:
                if self._prefetched is not None:
                    self.request = await self._prefetched.request()
                else:
                    if self._mcp is not None:  # calls approved since: run, then answer
                        await self._mcp.run_approved()
                    self.request = await self._build_request(self.response_id)
                    if self.request.transcript is not None:  # stored and announced already
                        self._heard_before(self.request.transcript)
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
            kind = CLIENT_ERRORS.get(error, "server_error")
            self._emit(ErrorEvent(code=error, message=reason, error_type=kind))
        await self._finish(status, reason, error or "")
        if status == "completed" and self._spoken.audio_ms > 0:
            try:
                await self._sink.drained()
            except asyncio.CancelledError:
                if not self._handed_over:  # cut off while its last audio was still playing
                    await asyncio.wait_for(self._finish_cancelled(), FINALIZE_TIMEOUT_S)
                raise
        return status

    async def discard_prefetched(self) -> None:
        """Abort the adopted work, if any (its stream does so itself once it runs)."""
        if self._prefetched is not None:
            await self._prefetched.discard()

    @property
    def generating(self) -> bool:
        """Not done yet: after response.done only its last audio may still be playing."""
        return self.status is None

    def hand_over(self) -> None:
        """A new answer follows this finished one: stop waiting for the playout (the audio
        plays on, the next answer's after it) and leave the item as it was committed."""
        self._handed_over = True

    async def _generate(self, request: PipelineRequest) -> tuple[ResponseStatus, str, str | None]:
        """Stream the answer; returns its status, the reason, and an error code if it failed.
        After MCP calls the model made, it goes on reading their results (up to
        `MCP_ROUNDS` times), in the same response."""
        outcome = await self._stream(request, first=True)
        for round_ in range(1, MCP_ROUNDS):
            if self._mcp is None or outcome[0] != "completed":
                break
            await self._mcp.run_ready()
            if not self._mcp.ran:
                break
            heard = self._heard_words if round_ == 1 else ""  # the turn joins once
            request = follow_up(request, self._mcp.ran, heard, round_)
            self._mcp.ran = []
            outcome = await self._stream(request, first=False)
        return outcome

    async def _stream(
        self, request: PipelineRequest, *, first: bool
    ) -> tuple[ResponseStatus, str, str | None]:
        if self._prefetched is not None and first:
            stream = self._prefetched.stream()
        else:
            stream = self._pipeline.generate(request)
        first_call: str | None = None  # parallel_tool_calls off: the round's only call
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
                        self._on_input_transcript(chunk)
                    case TextDelta():
                        await self._flush_input_transcript()
                        await self._on_text(chunk.text)
                    case ToolCallDelta():
                        await self._flush_input_transcript()
                        first_call = first_call or chunk.call_id
                        if self.options.parallel_tool_calls or chunk.call_id == first_call:
                            await self._on_tool_call(chunk)
                        else:  # parallel_tool_calls off: the model's second call is dropped
                            log.debug("response %s: call %s dropped", self.response_id, chunk)
                    case AudioChunk():
                        await self._flush_input_transcript()
                        await self._on_audio(chunk)
                    case End():
                        await self._flush_input_transcript()
                        return "completed", "", None
                    case ErrorChunk():
                        where = f" in {chunk.stage}" if chunk.stage else ""
                        self._input_transcript_failed(chunk.message)
                        return "failed", f"model error{where}: {chunk.message}", chunk.code

    async def _previous_id(self) -> str | None:
        """The conversation's last item, which a new output item follows."""
        if not self.options.in_conversation:
            return None
        try:
            return await self._history.last_id()
        except Exception:  # Redis down: the item still exists for this connection
            return None

    async def _announce(self) -> None:
        """The message item appears with the answer's first text or audio."""
        if not self._announced:
            self._announced = True
            previous = await self._previous_id()
            self._emit(
                ConversationItemCreated(
                    item=replace(self.item),
                    previous_item_id=previous,
                    response_id=self.response_id,
                )
            )

    async def _on_tool_call(self, chunk: ToolCallDelta) -> None:
        if self._mcp is not None and self._mcp.handles(chunk.name):
            await self._mcp.on_delta(chunk)
            return
        call = self.calls[-1] if self.calls else None
        if call is None or call.call_id != chunk.call_id or call.status != "in_progress":
            call = ConversationItem(
                id=new_id("item"),
                role="assistant",
                type="function_call",
                status="in_progress",
                name=chunk.name,
                call_id=chunk.call_id,
            )
            self.calls.append(call)
            previous = await self._previous_id()
            self._emit(
                ConversationItemCreated(
                    item=replace(call), previous_item_id=previous, response_id=self.response_id
                )
            )
        if chunk.arguments:
            call.arguments += chunk.arguments
            self._emit(
                FunctionCallArgumentsDelta(
                    response_id=self.response_id,
                    item_id=call.id,
                    call_id=call.call_id,
                    delta=chunk.arguments,
                )
            )
        if chunk.done:
            call.status = "completed"
            if self.options.in_conversation:
                await self._history.append(call)
            self._emit(FunctionCallArgumentsDone(response_id=self.response_id, item=replace(call)))

    async def _on_text(self, text: str) -> None:
        if not text:
            return
        await self._announce()
        if self._first_text_ms is None:
            self._first_text_ms = self._elapsed_ms()
        self._spoken.add_text(text)
        event_type = OutputAudioTranscriptDelta if self.item.has_audio else OutputTextDelta
        self._emit(event_type(response_id=self.response_id, item_id=self.item.id, delta=text))

    async def _on_audio(self, chunk: AudioChunk) -> None:
        if not self.item.has_audio or len(chunk.pcm) == 0:
            return
        await self._announce()
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

    def _heard_before(self, words: str, logprobs: Logprobs | None = None) -> None:
        """The turn's words were recognised before this answer (at its pause): they are
        stored and announced once (by whoever stored them, or at the flush), and the engine's
        echo of them is not announced again (it came after `.completed`, as a delta)."""
        self._heard_words = words
        self._input_transcript = [words] if words else []
        self._input_logprobs = logprobs
        self._heard_already = True

    def _on_input_transcript(self, chunk: TextDelta) -> None:
        """The recogniser's words as they come: each piece is a transcription delta."""
        if self._input_transcript is None or self._heard_already:
            return
        text, tokens = chunk.text, chunk.logprobs
        self._input_transcript.append(text)
        if tokens is not None:
            self._input_logprobs = (*(self._input_logprobs or ()), *tokens)
        if self._user_item_id is not None and text:
            delta = InputTranscriptionDelta(item_id=self._user_item_id, delta=text, logprobs=tokens)
            self._emit(delta)

    def _input_transcript_failed(self, message: str) -> None:
        """The answer failed before the user's audio was transcribed: say so."""
        if self._input_transcript is None or self._input_transcript:
            return
        self._input_transcript = None
        if self._user_item_id is not None and self.request is not None and len(self.request.audio):
            self._emit(InputTranscriptionFailed(item_id=self._user_item_id, message=message))

    async def _flush_input_transcript(self) -> None:
        """Store what the user said (the pipeline's speech recognition) on their item."""
        parts, self._input_transcript = self._input_transcript, None
        if not parts or self._user_item_id is None:
            return
        transcript = self._heard_words = "".join(parts).strip()
        user_item = await self._history.get(self._user_item_id)
        if user_item is not None:
            if user_item.text:
                return  # transcribed already, before this answer started (transcription.py)
            user_item.text = transcript
            await self._history.update(user_item)
        self._emit(
            InputTranscriptionCompleted(
                item_id=self._user_item_id, transcript=transcript, logprobs=self._input_logprobs
            )
        )

    def _usage(self) -> ResponseUsage:
        request = self.request
        words = 0
        if request is not None:
            words = len(request.instructions) + len(request.text or "")
            words += sum(len(item.text) + len(item.arguments) for item in request.history)
        return ResponseUsage(
            input_audio_ms=len(request.audio) * 1000 // INPUT_SAMPLE_RATE if request else 0,
            input_text_chars=words,
            output_audio_ms=round(self._spoken.audio_ms),
            output_text_chars=len(self._spoken.text),
            first_text_ms=self._first_text_ms,
            first_audio_ms=self._first_audio_ms,
            total_ms=self._elapsed_ms(),
        )

    async def _finish(self, status: ResponseStatus, reason: str, error: str = "") -> None:
        self.status = status
        self.item.status = "completed" if status == "completed" else "incomplete"
        if self._client_cut_ms is not None:  # the client cut it while it was running
            cut = min(self._client_cut_ms, round(self._spoken.audio_ms))
            self.item.text, self.item.audio_ms = self._spoken.heard(cut), cut
            self.item.status = "incomplete"
        else:
            self.item.text = self._spoken.text.strip()
            self.item.audio_ms = round(self._spoken.audio_ms)
        if self.committed:  # truncated by the client while it ran
            await self._history.update(self.item)
        elif self.options.in_conversation and (self.item.text or self.item.audio_ms):
            await self._history.append(self.item)
            self.committed = True
        for call in self.calls:
            if call.status == "in_progress":  # cut off mid-arguments: never run
                call.status = "incomplete"
        if status == "failed" and not self.redis_unavailable:  # an outage is logged once
            log.warning("response %s failed: %s", self.response_id, reason)
        self._emit(
            ResponseDone(
                response_id=self.response_id,
                status=status,
                reason=reason,
                error_code=error,
                item=self.item if self._announced else None,
                usage=self._usage(),
                metadata=self.metadata,
                calls=tuple(self.calls),
                in_conversation=self.options.in_conversation,
                audio_output=self.options.audio_output,
                max_output_tokens=self.options.max_output_tokens,
            )
        )

    async def _finish_cancelled(self) -> None:
        """Runs in the cancelled task: the sink was already cleared by the canceller."""
        if self.status is None:  # still generating: the response itself is cancelled
            await self._finish("cancelled", self.cancel_reason)
        if self.item.has_audio and self._spoken.audio_ms > 0:
            await self.truncate(self.played_ms)

    async def truncate(self, audio_end_ms: int, *, by_client: bool = False) -> None:
        """Cut the committed item to what was heard, and say so. The client's cut
        (conversation.item.truncate: it knows what it played) stands: the server's own
        estimate never lengthens it afterwards."""
        if by_client:
            self._client_cut_ms = audio_end_ms
        elif self._client_cut_ms is not None:
            return
        audio_end_ms = min(audio_end_ms, round(self._spoken.audio_ms))
        self.item.text = self._spoken.heard(audio_end_ms)
        self.item.audio_ms = audio_end_ms
        self.item.status = "incomplete"
        if self.committed:
            await self._history.update(self.item)
        elif self.options.in_conversation and (self.item.text or audio_end_ms):
            await self._history.append(self.item)
            self.committed = True
        self._emit(ConversationItemTruncated(item_id=self.item.id, audio_end_ms=audio_end_ms))
