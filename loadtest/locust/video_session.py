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
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect

from .inbox import Inbox, Stamped
from .stats import BARGE_IN, CONNECT, PROCESSING, VOICE_TO_VOICE, Recorder

PROTOCOL = "VIDEO"
FPS = 2
RATE_IN = 16_000
CHUNK = RATE_IN // 50
BARGE_AFTER_S = 0.6


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
    with wave.open(io.BytesIO(base64.b64decode(delta.event["data"]))) as reader:
        frames = reader.readframes(reader.getnframes())
        return reader.getnframes() / reader.getframerate(), frames


async def _read(ws: ClientConnection, inbox: Inbox) -> None:
    async for raw in ws:
        inbox.put(time.monotonic(), json.loads(raw))


async def _ask(
    ws: ClientConnection, inbox: Inbox, rec: Recorder, question: np.ndarray, stop: np.ndarray | None
) -> None:
    mark = inbox.mark()
    last_voiced = await _say(ws, question)
    queried = time.monotonic()
    await ws.send(json.dumps({"type": "video.query", "text": ""}))
    first = await inbox.wait_type("response.audio.delta", mark, 30)
    rec.time(PROTOCOL, VOICE_TO_VOICE, (first.at - last_voiced) * 1000)
    rec.time(PROTOCOL, PROCESSING, (first.at - queried) * 1000)
    if stop is None:
        await inbox.wait_type("response.audio.done", mark, 60)
    else:
        await asyncio.sleep(max(0.0, first.at + BARGE_AFTER_S - time.monotonic()))
        stop_start = time.monotonic()
        await _say(ws, stop)
        interrupt = inbox.mark()
        await ws.send(json.dumps({"type": "video.query", "text": ""}))
        await inbox.wait_type("response.start", interrupt, 30)
    deltas = [s for s in inbox.since(mark, "response.audio.delta")]
    if stop is not None:
        ends = [s.at for s in inbox.since(interrupt, "response.start")]
        deltas = [s for s in deltas if s.at < ends[0]]
    speaker, played = first.at, 0.0
    for delta in deltas:
        seconds = _seconds(delta)[0]
        speaker, played = max(speaker, delta.at) + seconds, played + seconds
    rec.count(f"{PROTOCOL} answers")
    rec.count(f"{PROTOCOL} answer_audio_s", played)
    if stop is not None:
        rec.time(PROTOCOL, BARGE_IN, max(0.0, speaker - stop_start) * 1000)
        rec.count(f"{PROTOCOL} barge_ins")
        await inbox.wait_type("response.audio.done", interrupt, 60)
    await asyncio.sleep(max(0.0, speaker - time.monotonic()) + 0.3)


async def video_session(
    ws_base: str,
    rec: Recorder,
    question: np.ndarray,
    stop: np.ndarray,
    turns: int,
    barge_every: int,
    start: int,
) -> None:
    began = time.monotonic()
    async with connect(f"{ws_base}/v1/video/chat/stream", proxy=None, max_size=None) as ws:
        inbox = Inbox()
        reader = asyncio.create_task(_read(ws, inbox))
        camera: asyncio.Task[None] | None = None
        try:
            config = {"type": "session.config", "parley": {"extras": True}}
            await ws.send(json.dumps(config))
            await inbox.wait_type("session.created", 0, 30)
            rec.time(PROTOCOL, CONNECT, (time.monotonic() - began) * 1000)
            camera = asyncio.create_task(_camera(ws))
            for i in range(turns):
                barge = barge_every > 0 and (start + i) % barge_every == barge_every - 1
                await _ask(ws, inbox, rec, question, stop if barge else None)
            await ws.send(json.dumps({"type": "video.done"}))
            await inbox.wait_type("session.done", 0, 30)
        finally:
            tasks = [t for t in (camera, reader) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
