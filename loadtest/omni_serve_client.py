"""One OpenAI Realtime WebSocket client of the serve benchmark: a microphone that speaks a
question, then silence, and a listener that times the answer as the client hears it.

The microphone sends 20 ms chunks of 24 kHz PCM16 (the WebSocket's default format) on the
clock, each when a microphone would have captured its last sample, and keeps sending low
noise after the question, as a real one does: with server VAD (Parley's default) that
silence is what ends the turn. With `manual` turns (turn detection off) the client sends
`input_audio_buffer.commit` and `response.create` right after the speech instead.

A question may come with camera frames: the client then sends a JPEG every 500 ms while it
speaks (a user item of `input_image` parts, as a camera at 2 frames a second would), and the
turn takes those of its moment. A session may cap its answers (`max_output_tokens`, sent in
its `session.update`).

Each request is timed from the end of the speech the client sent (the moment its last
voiced chunk went out): the server's `speech_stopped`, the first text delta, the first
audio delta. Playback is simulated: a player starts at the first audio delta and plays
each delta in turn; a delta that arrives after the player ran dry is a stall of that
long. The server paces audio at real time with a lead, so a server that keeps up shows no
stall after the first delta, and the answer's RTF as heard (from its first audio to the
end of its playback, over its length) is 1 plus its stalls over its length: the graph's own
RTF (omni_bench) is behind the pacing, out of a client's sight.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection, connect

from pipeline.tasks import TaskSet

RATE = 24_000
CHUNK = RATE // 50
"""Samples in one 20 ms chunk."""
NOISE = 30
"""Peak of the noise sent as silence: a microphone never sends digital zero."""
ANSWER_TIMEOUT_S = 120.0
FRAME_EVERY_S = 0.5
"""A camera frame every this long while the client speaks (2 frames a second)."""


@dataclass
class Request:
    """What one question's answer looked like from the client, ms from the end of speech."""

    level: int
    client: int
    round: int
    warmup: bool
    speech_s: float
    speech_stopped_ms: float | None = None
    first_text_ms: float | None = None
    first_audio_ms: float | None = None
    audio_s: float = 0.0
    deltas: int = 0
    stall_max_ms: float = 0.0
    stall_total_ms: float = 0.0
    status: str | None = None
    error: str | None = None
    frames_sent: int = 0
    answer_tokens: int | None = None
    """The session's `max_output_tokens` (None: not capped)."""
    refused: bool = False
    """The server refused the session at its start, with the reason in `error`: past the
    graph's capacity a session waits and is served, or is refused; neither is a failure."""

    @property
    def rtf_heard(self) -> float | None:
        """From the first audio to the end of the answer's playback, over its length: 1.0
        when it played without a wait."""
        if not self.audio_s:
            return None
        return (self.audio_s + self.stall_total_ms / 1000) / self.audio_s

    @property
    def first_audio_after_stop_ms(self) -> float | None:
        """First audio counted from the server's end of turn instead of the speech's end."""
        if self.first_audio_ms is None or self.speech_stopped_ms is None:
            return None
        return self.first_audio_ms - self.speech_stopped_ms

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out["first_audio_after_stop_ms"] = self.first_audio_after_stop_ms
        out["rtf_heard"] = self.rtf_heard
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


@dataclass
class _Player:
    """A real-time player fed by the audio deltas: how long it ran dry between them."""

    ends_at: float | None = None
    stalls: list[float] = field(default_factory=list)

    def feed(self, at: float, seconds: float) -> None:
        if self.ends_at is None:
            self.ends_at = at
        elif at > self.ends_at:
            self.stalls.append(at - self.ends_at)
            self.ends_at = at
        self.ends_at += seconds


def chunks(pcm: npt.NDArray[np.int16]) -> list[str]:
    """`pcm` as `input_audio_buffer.append` texts of 20 ms each (the last one padded)."""
    count = -(-len(pcm) // CHUNK)
    padded = np.zeros(count * CHUNK, np.int16)
    padded[: len(pcm)] = pcm
    texts = []
    for i in range(count):
        raw = padded[i * CHUNK : (i + 1) * CHUNK].astype("<i2").tobytes()
        audio = base64.b64encode(raw).decode("ascii")
        texts.append(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    return texts


def image_item(jpeg: bytes) -> str:
    """A camera frame as the client sends it: a user item of one `input_image` part."""
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
    content = [{"type": "input_image", "image_url": url}]
    item = {"type": "message", "role": "user", "content": content}
    return json.dumps({"type": "conversation.item.create", "item": item})


def silence_chunks(count: int = 16, seed: int = 5) -> list[str]:
    rng = np.random.default_rng(seed)
    noise = rng.integers(-NOISE, NOISE + 1, CHUNK * count).astype(np.int16)
    return chunks(noise)


class Client:
    """One session: `ask()` a question at a time, its microphone running in between."""

    def __init__(
        self, ws: ClientConnection, manual: bool, answer_tokens: int | None = None
    ) -> None:
        self.ws = ws
        self.manual = manual
        self.answer_tokens = answer_tokens
        self._silence = silence_chunks()

    async def setup(self) -> None:
        """Open the session; Refused if the server turns it away (e.g. `session_limit`)."""
        try:
            await self._expect("session.created")
        except ServerError as exc:
            raise Refused(exc.code, exc.message) from None
        session: dict[str, Any] = {"type": "realtime"}
        if self.manual:
            session["audio"] = {"input": {"turn_detection": None}}
        if self.answer_tokens is not None:
            session["max_output_tokens"] = self.answer_tokens
        if len(session) > 1:
            await self.ws.send(json.dumps({"type": "session.update", "session": session}))
            await self._expect("session.updated")

    async def _expect(self, name: str) -> None:
        async with asyncio.timeout(30):
            while True:
                event = json.loads(await self.ws.recv())
                if event["type"] == "error":
                    error = event.get("error") or {}
                    raise ServerError(str(error.get("code")), str(error.get("message")))
                if event["type"] == name:
                    return

    async def _send_on_clock(
        self, texts: list[str], start: float, frames: list[str], request: Request
    ) -> float:
        """Send each chunk when its last sample would have been captured, and a camera
        frame every FRAME_EVERY_S beside them; the time the last chunk went out."""
        sent = start
        every = round(FRAME_EVERY_S / 0.02)
        for i, text in enumerate(texts):
            delay = start + (i + 1) * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if frames and i % every == 0:
                await self.ws.send(frames[request.frames_sent % len(frames)])
                request.frames_sent += 1
            await self.ws.send(text)
            sent = time.monotonic()
        return sent

    async def _silence_forever(self) -> None:
        start = time.monotonic()
        i = 0
        while True:
            delay = start + (i + 1) * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.ws.send(self._silence[i % len(self._silence)])
            i += 1

    async def ask(
        self, speech: list[str], request: Request, frames: list[str] | None = None
    ) -> Request:
        """Say the question (chunks from `chunks()`; with camera frames from `image_item()`
        while it speaks), then listen until its answer is done and would have finished
        playing; the microphone sends silence meanwhile."""
        spoken_at = await self._send_on_clock(speech, time.monotonic(), frames or [], request)
        async with TaskSet("omni-serve-client") as tasks:  # the microphone, if any
            if self.manual:
                await self.ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                await self.ws.send(json.dumps({"type": "response.create"}))
                spoken_at = time.monotonic()
                request.speech_stopped_ms = 0.0  # the turn ends at its commit
            else:
                tasks.create_task(self._silence_forever(), name="microphone")
            try:
                async with asyncio.timeout(ANSWER_TIMEOUT_S):
                    await self._listen(spoken_at, request)
            except TimeoutError:
                request.error = f"no answer within {ANSWER_TIMEOUT_S:g} s"
        return request

    async def _listen(self, spoken_at: float, request: Request) -> None:
        player = _Player()

        def ms(at: float) -> float:
            return (at - spoken_at) * 1000

        while True:
            raw = await self.ws.recv()
            at = time.monotonic()
            event: dict[str, Any] = json.loads(raw)
            kind = event["type"]
            if kind == "input_audio_buffer.speech_stopped" and request.speech_stopped_ms is None:
                request.speech_stopped_ms = ms(at)
            elif kind == "response.output_audio_transcript.delta":
                if request.first_text_ms is None:
                    request.first_text_ms = ms(at)
            elif kind == "response.output_audio.delta":
                seconds = len(base64.b64decode(event["delta"])) / 2 / RATE
                if request.first_audio_ms is None:
                    request.first_audio_ms = ms(at)
                request.audio_s += seconds
                request.deltas += 1
                player.feed(at, seconds)
            elif kind == "error":
                request.error = str(event.get("error", {}).get("message", event))
            elif kind == "response.done":
                request.status = event.get("response", {}).get("status")
                break
        request.stall_max_ms = max(player.stalls, default=0.0) * 1000
        request.stall_total_ms = sum(player.stalls) * 1000
        if player.ends_at is not None:  # hear the answer out before the next question
            await asyncio.sleep(max(0.0, player.ends_at - time.monotonic()))


class ServerError(RuntimeError):
    """An `error` event where the client waited for another event."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"server error {code}: {message}")
        self.code, self.message = code, message


class Refused(ServerError):
    """The server would not open the session (its reason in `code` and `message`)."""


def failed_session(request: Request, exc: BaseException) -> Request:
    """`request` marked with why its session failed, or was refused."""
    request.error = str(exc) if isinstance(exc, ServerError) else repr(exc)
    request.refused = isinstance(exc, Refused)
    return request


async def run_client(
    url: str,
    manual: bool,
    questions: list[list[str]],
    plan: list[tuple[int, bool]],
    level: int,
    index: int,
    speech_s: list[float],
    deadline: float | None = None,
) -> list[Request]:
    """One session asking a question per (round, warm-up) of `plan`, in turn; none is
    started that would end past `deadline` (time.monotonic()), judged by the last."""
    out: list[Request] = []
    async with connect(f"{url}/v1/realtime?model=parley", proxy=None, max_size=None) as ws:
        client = Client(ws, manual)
        await client.setup()
        last_s = 0.0
        for round_, warmup in plan:
            if deadline is not None and time.monotonic() + last_s > deadline:
                break
            started = time.monotonic()
            pick = (index + round_) % len(questions)
            request = Request(level, index, round_, warmup, speech_s[pick])
            out.append(await client.ask(questions[pick], request))
            last_s = time.monotonic() - started
    return out
