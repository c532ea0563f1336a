"""A video chat stream user (`/v1/video/chat/stream`, vLLM-Omni's protocol, Parley's extras on).

It streams camera frames (a JPEG whose brightness changes, `FPS` a second) and its microphone
(16 kHz PCM16 `audio.chunk`s of 20 ms, paced in real time), and asks by voice: after the
question's audio, an empty `video.query` (turns are manual on this stream). Figures:

- connect: socket opened -> `session.created`;
- voice_to_voice: the last voiced sample -> the first `response.audio.delta`;
- processing: the query sent -> that delta (the server learns the turn's end from the query);
- barge_in: 0.6 s into the answer the user says "stop" and sends a new query; from the
  start of that speech -> the end of the old answer's audio as a client plays it. The
  server only hears the interruption with the query, so this includes the spoken words.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import wave

import numpy as np
import soxr
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect

from pipeline.tasks import TaskSet

from .inbox import Inbox, Stamped
from .stats import BARGE_IN, CONNECT, PROCESSING, VOICE_TO_VOICE, Recorder

PROTOCOL = "VIDEO"
FPS = 2
RATE_IN = 16_000
CHUNK = RATE_IN // 50
BARGE_AFTER_S = 0.6
CLIP_RATE = 24_000


def _jpeg(level: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (160, 120), (level, 90, 255 - level)).save(out, "JPEG")
    return base64.b64encode(out.getvalue()).decode()


FRAMES = [_jpeg(level) for level in range(0, 256, 32)]


async def _camera(ws: ClientConnection) -> None:
    for n in range(1_000_000):
        await ws.send(json.dumps({"type": "video.frame", "data": FRAMES[n % len(FRAMES)]}))
        await asyncio.sleep(1 / FPS)


async def _say(ws: ClientConnection, pcm: np.ndarray) -> float:
    """Stream `pcm` (16 kHz) in real time; the monotonic time its last sample was captured."""
    t0 = time.monotonic()
    for k, start in enumerate(range(0, len(pcm), CHUNK)):
        due = t0 + (k + 1) * CHUNK / RATE_IN
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        data = base64.b64encode(pcm[start : start + CHUNK].astype("<i2").tobytes()).decode()
        await ws.send(json.dumps({"type": "audio.chunk", "data": data}))
    return t0 + len(pcm) / RATE_IN


def _seconds(delta: Stamped) -> tuple[float, bytes]:
    """The delta's length, and its audio as PCM16 at CLIP_RATE (for the quality figure)."""
    with wave.open(io.BytesIO(base64.b64decode(delta.event["data"]))) as reader:
        rate, frames = reader.getframerate(), reader.readframes(reader.getnframes())
    pcm = np.frombuffer(frames, dtype="<i2")
    if rate != CLIP_RATE:
        pcm = np.asarray(soxr.resample(pcm, rate, CLIP_RATE), dtype=np.int16)
    return len(frames) / 2 / rate, pcm.astype("<i2").tobytes()


async def _read(ws: ClientConnection, inbox: Inbox) -> None:
    async for raw in ws:
        inbox.put(time.monotonic(), json.loads(raw))


async def _ask(
    ws: ClientConnection,
    inbox: Inbox,
    rec: Recorder,
    question: np.ndarray,
    stop: np.ndarray | None,
    text: str,
) -> None:
    last_voiced = await _say(ws, question)
    queried, asked = time.monotonic(), inbox.mark()
    await ws.send(json.dumps({"type": "video.query", "text": ""}))
    begin = inbox.position(await inbox.wait_type("response.start", asked, 30))
    first = await inbox.wait_type("response.audio.delta", begin, 30)
    rec.time(PROTOCOL, VOICE_TO_VOICE, (first.at - last_voiced) * 1000)
    rec.time(PROTOCOL, PROCESSING, (first.at - queried) * 1000)
    if stop is None:
        end = inbox.position(await inbox.wait_type("response.audio.done", begin, 60))
    else:
        await asyncio.sleep(max(0.0, first.at + BARGE_AFTER_S - time.monotonic()))
        stop_start = time.monotonic()
        await _say(ws, stop)
        interrupt = inbox.mark()
        await ws.send(json.dumps({"type": "video.query", "text": ""}))
        # The old answer's audio is what came before the interruption's answer starts.
        end = inbox.position(await inbox.wait_type("response.start", interrupt, 30))
    speaker, played, audio = _play(inbox.events[begin:end], first.at)
    rec.count(f"{PROTOCOL} answers")
    rec.count(f"{PROTOCOL} answer_audio_s", played)
    if stop is None:
        rec.clip(PROTOCOL, text, audio)
    else:
        rec.time(PROTOCOL, BARGE_IN, max(0.0, speaker - stop_start) * 1000)
        rec.count(f"{PROTOCOL} barge_ins")
        done = inbox.position(await inbox.wait_type("response.audio.done", end, 60))
        speaker = _play(inbox.events[end:done], speaker)[0]  # the interruption's own answer
    await asyncio.sleep(max(0.0, speaker - time.monotonic()) + 0.3)


def _play(events: list[Stamped], start: float) -> tuple[float, float, bytes]:
    """The audio deltas among `events` through a client's playback queue that is free from
    `start`: when it finishes, the seconds played, the audio (PCM16 at CLIP_RATE)."""
    speaker, played, audio = start, 0.0, []
    for delta in events:
        if delta.type == "response.audio.delta":
            seconds, pcm = _seconds(delta)
            speaker, played = max(speaker, delta.at) + seconds, played + seconds
            audio.append(pcm)
    return speaker, played, b"".join(audio)


async def video_session(
    ws_base: str,
    rec: Recorder,
    question: np.ndarray,
    stop: np.ndarray,
    turns: int,
    barge_every: int,
    start: int,
    text: str = "",
) -> None:
    """One stream of `turns` spoken questions (`text`: what they say, for the quality figure)."""
    began = time.monotonic()
    async with connect(f"{ws_base}/v1/video/chat/stream", proxy=None, max_size=None) as ws:
        inbox = Inbox()
        async with TaskSet("video-session") as tasks:  # the reader and the camera
            tasks.create_task(_read(ws, inbox))
            config = {"type": "session.config", "parley": {"extras": True}}
            await ws.send(json.dumps(config))
            await inbox.wait_type("session.created", 0, 30)
            rec.time(PROTOCOL, CONNECT, (time.monotonic() - began) * 1000)
            tasks.create_task(_camera(ws))
            for i in range(turns):
                barge = barge_every > 0 and (start + i) % barge_every == barge_every - 1
                await _ask(ws, inbox, rec, question, stop if barge else None, text)
            await ws.send(json.dumps({"type": "video.done"}))
            await inbox.wait_type("session.done", 0, 30)
