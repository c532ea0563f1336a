"""A fake model engine that obeys the engine contract, for session tests.

It streams a fixed answer as text deltas, then as audio (a tone, so it is audibly not
silence) at a set pace, and holds per-request state that abort or cancellation removes.
With tools it acts as a model that always uses them: it calls the forced tool, or the first
one (the first `calls` ones: parallel calls, whatever the request's `parallel_tool_calls`),
with each required argument set to "fake" (in two argument deltas); after a function
call's output it answers "The tool said: <output>". `max_output_tokens` caps its words. A
transcription-only request is "heard <n> ms" (a word a token, each of log-probability -0.25,
when the request asks for its tokens).
Its pace is in the time of the given `Clock` (a test's `ScaledClock` runs it faster).
The same contract tests run against it and the real engines (tests/pipeline).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncGenerator

import numpy as np

from pipeline.requests import RequestTracker
from pipeline.types import (
    AudioChunk,
    Chunk,
    End,
    EntryEngine,
    ErrorChunk,
    Logprobs,
    PipelineRequest,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
)
from sessions.clock import REAL_CLOCK, Clock


def fake_tokens(text: str) -> Logprobs:
    """A fake recogniser's tokens of `text`: a word each (with the space before it)."""
    return tuple(TokenLogprob(w, -0.25, w.encode()) for w in re.findall(r"\s*\S+", text))


class FakeEngine(EntryEngine):
    name = "fake"

    def __init__(
        self,
        text: str = "Hello there, this is the fake model answering you.",
        text_interval_s: float = 0.005,
        audio_ms: int = 2_000,
        chunk_ms: int = 100,
        realtime_factor: float = 4.0,
        fail_with: str | None = None,
        fail_code: str = "model_error",
        first_chunk_delay_s: float = 0.0,
        start_delay_s: float = 0.0,
        clock: Clock = REAL_CLOCK,
        transcript: str | None = None,
        calls: int = 1,
    ) -> None:
        self.text = text
        self.calls = calls
        self.text_interval_s = text_interval_s
        self.audio_ms = audio_ms
        self.chunk_ms = chunk_ms
        self.realtime_factor = realtime_factor
        self.fail_with = fail_with
        self.fail_code = fail_code
        """The failure's ErrorChunk code (`context_length_exceeded`, `server_busy`, ...)."""
        self.first_chunk_delay_s = first_chunk_delay_s
        self.start_delay_s = start_delay_s
        self.clock = clock
        self.transcript = transcript
        """What its recogniser hears, whatever the audio (None: "heard <n> ms")."""
        self.draft: str | None = None
        """A quick draft of the words, sent first to a request that asks for one
        (`draft_transcript`), with `turn_end` as its verdict; None: no draft."""
        self.final_delay_s = 0.0
        """How long after a draft the final words come (a slower recogniser)."""
        self.turn_end: str | None = None
        """Its verdict on the words at a pause when asked (`judge_turn_end`): "finished",
        "unfinished", or None for an engine that cannot judge."""
        self.requests: list[PipelineRequest] = []
        """The answers asked of it (transcription-only requests are in `transcriptions`)."""
        self.transcriptions: list[PipelineRequest] = []
        self.aborted: list[str] = []
        self._held: RequestTracker[None] = RequestTracker()

    async def start(self) -> None:
        """Models take a while to load; `start_delay_s` stands in for that."""
        await self.clock.sleep(self.start_delay_s)

    async def close(self) -> None:
        self._held.clear()

    def active_requests(self) -> int:
        return len(self._held)

    def holds(self, request_id: str) -> bool:
        """Whether the engine still keeps state for this request."""
        return request_id in self._held

    async def abort(self, request_id: str) -> None:
        if request_id in self._held:
            self._held.abort(request_id)
            self.aborted.append(request_id)

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        (self.transcriptions if request.transcribe_only else self.requests).append(request)
        self._held.begin(request_id)
        try:
            await self.clock.sleep(self.first_chunk_delay_s)
            if self.fail_with:
                yield ErrorChunk(message=self.fail_with, stage=self.name, code=self.fail_code)
                return
            if request.transcribe_only and request.draft_transcript and self.draft is not None:
                yield TextDelta(text=self.draft, kind="draft_transcript")
                if request.judge_turn_end and self.turn_end is not None:
                    yield TextDelta(text=self.turn_end, kind="turn_end")
                await self.clock.sleep(self.final_delay_s)
            if request.transcribe_only:  # a fake recogniser: it hears how long it was
                ms = len(request.audio) * 1000 // 16_000
                heard = f"heard {ms} ms" if self.transcript is None else self.transcript
                tokens = fake_tokens(heard) if request.recognition.logprobs else None
                yield TextDelta(text=heard, kind="input_transcript", logprobs=tokens)
                if request.judge_turn_end and self.turn_end is not None:
                    yield TextDelta(text=self.turn_end, kind="turn_end")
                yield End()
                return
            call = self._tool_call(request)
            if call is not None:
                for piece in call:
                    yield piece
                    await self.clock.sleep(self.text_interval_s)
                yield End()
                return
            answered = [i for i in request.history if i.kind == "function_call_output"]
            text = f"The tool said: {answered[-1].text}" if answered else self.text
            words = text.split(" ")[: request.max_output_tokens or None]
            for word in words:
                if self._held.aborted(request_id):
                    return
                yield TextDelta(text=word + " ")
                await self.clock.sleep(self.text_interval_s)
            rate = request.output_sample_rate
            samples = rate * self.chunk_ms // 1000
            t = np.arange(samples) / rate
            tone = (8000 * np.sin(2 * np.pi * 220 * t)).astype(np.int16)
            for _ in range(self.audio_ms // self.chunk_ms):
                if self._held.aborted(request_id):
                    return
                yield AudioChunk(pcm=tone.copy(), sample_rate=rate)
                await self.clock.sleep(self.chunk_ms / 1000 / self.realtime_factor)
            yield End()
        except (asyncio.CancelledError, GeneratorExit):  # cancelled, or the stream closed early
            self.aborted.append(request_id)
            raise
        finally:
            self._held.end(request_id)

    def _tool_call(self, request: PipelineRequest) -> list[ToolCallDelta] | None:
        """The calls this fake makes, or None to answer in words."""
        if not request.tools or request.tool_choice == "none":
            return None
        last = request.history[-1] if request.history else None
        if last is not None and last.kind == "function_call_output" and request.text is None:
            return None  # the output is in: answer with it
        by_name = {tool.name: tool for tool in request.tools}
        forced = by_name.get(request.tool_choice)
        tools = [forced] if forced is not None else list(request.tools[: self.calls])
        pieces: list[ToolCallDelta] = []
        for tool in tools:
            required = tool.parameters.get("required", [])
            arguments = json.dumps({name: "fake" for name in required})
            call_id = f"call_{secrets.token_hex(6)}"
            half = len(arguments) // 2
            pieces += [
                ToolCallDelta(call_id, tool.name, arguments[:half]),
                ToolCallDelta(call_id, tool.name, arguments[half:], done=True),
            ]
        return pieces
