"""A Thinker on any OpenAI-compatible model server: vLLM, SGLang, llama.cpp's server, Ollama,
a hosted API (`engine: openai_chat.thinker`).

Parley keeps what is realtime (the transports, turn-taking, barge-in, resume, the speech
out); the words come from the user's own model server over `/v1/chat/completions`,
streamed. A spoken turn is recognised here first (Whisper, as the cascade's Thinker does,
or the transcript already made at the turn's pause), then the conversation goes out as chat
messages (chat_messages.py), and the streamed answer comes back as text and function calls
(chat_stream.py) for the Talker after it.

- Many sessions at once: one pooled HTTP client, every request its own stream; the server
  batches them. Nothing here serialises requests.
- A cancel (barge-in, response.cancel, a session's end) closes the stream at once: the
  server sees the client go and aborts the request.
- Failures are words: the response ends `failed` with the reason (ChatStreamError), the
  session goes on, and the next turn tries again.
- A probe asks the server for its models every `probe_s`; while it cannot answer, the
  stage reports the reason (`stalled`), so `/readyz` names the model server as down while
  everything else keeps serving. A server can answer `/models` while its generation is
  wedged: an answer that stalls past `stall_timeout_s` marks the server down too, until a
  later answer streams or the probe's own one-token answer comes back.
- `api_key_env` names the environment variable with the key (never the key itself in a
  graph file); none is sent when it is unset.

Place it in the main process (`placement: {process: main}`): its work is waiting on the
server, and the probe's finding reaches `/readyz` through `stalled`, which the host of a
worker process would take for a hung stage and restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from ...requests import RequestTracker
from ...tasks import background, cancel_and_wait
from ...types import Chunk, End, EntryEngine, ErrorChunk, PipelineRequest, TextDelta
from ..cascade.asr import DEFAULT_RECOGNIZER, RECOGNIZERS, Recognizer, make_recognizer
from ..cascade.transcript import Transcript
from .chat_messages import DEFAULT_INSTRUCTIONS, chat_messages, request_body
from .chat_stream import ChatDeltas, ChatStreamError, ChatStreamStalled, chat_chunks

log = logging.getLogger("parley.pipeline.openai_chat")

NOT_HEARD = "Sorry, I did not catch that."
SAMPLING = ("temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty", "seed")


class ChatThinkerEngine(EntryEngine):
    name = "thinker"

    def __init__(
        self,
        *,
        url: str,
        model: str,
        api_key_env: str = "",
        max_tokens: int = 256,
        connect_timeout_s: float = 5.0,
        stall_timeout_s: float = 30.0,
        probe_s: float = 5.0,
        max_connections: int = 256,
        images: bool = False,
        recognizer: str = DEFAULT_RECOGNIZER,
        default_instructions: str = DEFAULT_INSTRUCTIONS,
        sampling: dict[str, Any] | None = None,
        strict_tools: bool = False,
    ) -> None:
        """`url`: the server's base, up to `/v1` (`http://host:8000/v1`); `model`: the
        name it serves; `images`: send the turn's camera frames (a vision model);
        `recognizer`: "whisper", "whisper-tiny", "pocketsphinx" or "none" (text turns only);
        `sampling`: temperature, top_p, top_k, frequency_penalty, presence_penalty, seed;
        `strict_tools`: ask the server to hold a call's arguments to its tool's schema (vLLM
        needs it)."""
        if recognizer not in (*RECOGNIZERS, "none"):
            raise ValueError(f"recognizer must be one of {', '.join(RECOGNIZERS)} or none")
        unknown = sorted(set(sampling or {}) - set(SAMPLING))
        if unknown:
            raise ValueError(f"unknown sampling setting {unknown[0]!r}: use {', '.join(SAMPLING)}")
        self.base_url = url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.max_tokens = max_tokens
        self.connect_timeout_s = connect_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.probe_s = probe_s
        self.max_connections = max_connections
        self.images = images
        self.recognizer = recognizer
        self.default_instructions = default_instructions
        self.sampling = dict(sampling or {})
        self.strict_tools = strict_tools
        self.last_usage: dict[str, Any] | None = None
        """The usage of the latest answer (`prompt_tokens_details.cached_tokens`: the
        prefix the server's cache had)."""
        self.down: str | None = None
        """Why the server cannot be reached now (the probe's finding), or None."""
        self.wedged: str | None = None
        """Why the server's answers stall although it is reached (the last answer's stall,
        until an answer streams again), or None."""
        self._client: httpx.AsyncClient | None = None
        self._recognizer: Recognizer | None = None
        self._requests: RequestTracker[None] = RequestTracker()
        self._probe: asyncio.Task[None] | None = None

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def start(self) -> None:
        if self._client is not None:
            return
        limits = httpx.Limits(
            max_connections=self.max_connections, max_keepalive_connections=self.max_connections
        )
        self._client = httpx.AsyncClient(limits=limits)
        if self.recognizer != "none":
            self._recognizer = await asyncio.to_thread(make_recognizer, self.recognizer)
        self._probe = background(self._probing(), "openai_chat:probe")

    async def close(self) -> None:
        self._requests.clear()
        probe, self._probe = self._probe, None
        await cancel_and_wait(probe)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def active_requests(self) -> int:
        return len(self._requests)

    async def abort(self, request_id: str) -> None:
        self._requests.abort(request_id)

    def stalled(self, bound_s: float) -> str | None:
        return self.down or self.wedged

    async def _probing(self) -> None:
        """Ask the server for its models every `probe_s`; `down` says why it did not answer.
        While its answers are wedged, also ask it for a one-token answer, which clears it."""
        while True:
            self.down = await self.probe()
            if self.down is None and self.wedged is not None and await self._answers():
                log.info("the model server at %s answers again", self.base_url)
                self.wedged = None
            await asyncio.sleep(self.probe_s)

    def _stream(
        self, client: httpx.AsyncClient, body: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        """One streamed completion of `body` from the server, with this engine's timeouts."""
        return chat_chunks(
            client,
            self.chat_url,
            body,
            headers=self.headers(),
            connect_s=self.connect_timeout_s,
            stall_s=self.stall_timeout_s,
        )

    async def _answers(self) -> bool:
        """The server streams a one-token answer to its end, nothing stalling past the stall
        timeout."""
        if self._client is None:
            return False
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 1,
            "stream": True,
        }
        stream = self._stream(self._client, body)
        try:
            async with contextlib.aclosing(stream):
                async for _chunk in stream:
                    pass  # to its end: a wedged server may send the first, empty one
        except ChatStreamError:
            return False
        return True

    async def probe(self) -> str | None:
        """None when the server answers `GET /models`, else why it did not."""
        if self._client is None:
            return "the thinker was not started"
        try:
            got = await self._client.get(
                f"{self.base_url}/models",
                headers=self.headers(),
                timeout=httpx.Timeout(self.connect_timeout_s),
            )
        except httpx.HTTPError as exc:
            reason = f"the model server at {self.base_url} cannot be reached: {exc!r}"
            if self.down != reason:
                log.warning("%s", reason)
            return reason
        if got.status_code >= 400:
            return f"the model server at {self.base_url} answered {got.status_code} to /models"
        return None

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        client = self._client
        if client is None:
            yield ErrorChunk(message="the thinker was not started", stage=self.name)
            return
        with self._requests.track(request_id):
            user_text = request.text or ""
            heard = ""
            if len(request.audio):
                transcript = await self._heard(request)
                if self._requests.aborted(request_id):
                    return
                heard = transcript.text
                if heard:
                    yield TextDelta(heard, kind="input_transcript", logprobs=transcript.logprobs)
                user_text = " ".join(t for t in (user_text, heard) if t)
            if request.transcribe_only:
                yield End()
                return
            if len(request.audio) and not user_text.strip():
                yield TextDelta(text=NOT_HEARD)
                yield End()
                return
            try:
                messages = chat_messages(
                    request,
                    user_text,
                    images=self.images,
                    default_instructions=self.default_instructions,
                )
                body = request_body(
                    request,
                    messages,
                    model=self.model,
                    max_tokens=self.max_tokens,
                    sampling=self.sampling,
                    strict_tools=self.strict_tools,
                )
            except ValueError as exc:
                yield ErrorChunk(message=str(exc), stage=self.name)
                return
            async for chunk in self._answer(client, request_id, body):
                yield chunk

    async def _heard(self, request: PipelineRequest) -> Transcript:
        if request.transcript is not None:  # recognised at the turn's pause
            return Transcript(request.transcript)
        if self._recognizer is None:
            return Transcript("")
        return await asyncio.to_thread(
            self._recognizer.recognise, request.audio, request.recognition
        )

    async def _answer(
        self, client: httpx.AsyncClient, request_id: str, body: dict[str, Any]
    ) -> AsyncGenerator[Chunk, None]:
        deltas = ChatDeltas()
        began = time.monotonic()
        stream = self._stream(client, body)
        async with contextlib.aclosing(stream):  # closed early: the connection too
            try:
                async for chunk in stream:
                    if self._requests.aborted(request_id):
                        return
                    for delta in deltas.feed(chunk):
                        yield delta
                for delta in deltas.finish():
                    yield delta
            except ChatStreamError as exc:
                log.warning("request %s: %s", request_id, exc)
                if isinstance(exc, ChatStreamStalled):
                    self.wedged = f"{exc}: its answers stall (it may still list its models)"
                yield ErrorChunk(message=str(exc), stage=self.name)
                return
        self.wedged = None  # it answered
        self.last_usage = deltas.usage
        log.debug("request %s answered in %.2f s", request_id, time.monotonic() - began)
        if not self._requests.aborted(request_id):
            yield End()
