"""A WebRTC user, OpenAI's call flow: an ephemeral key from /v1/realtime/client_secrets, the
offer POSTed to /v1/realtime/calls with it, events on the `oai-events` data channel.

The caller is `loadtest.webrtc_client.Caller` (a real aiortc peer, Opus both ways: its
microphone sends 48 kHz frames in real time, its ear timestamps every frame heard). Figures:

- connect: client_secrets requested -> `session.created` on the data channel (HTTP, ICE,
  DTLS and SCTP included);
- voice_to_voice: the question's last voiced sample -> the first loud frame of the answer;
- processing: `input_audio_buffer.speech_stopped` -> that frame;
- answer_gap: per answer, the longest gap between two frames heard while it plays; frames
  that come over `LATE_GAP_S` after the one before count as late (`WebRTC late_frames` of
  `WebRTC frames`), the client's view of `parley_webrtc_late_frames_total`;
- barge_in: the first frame of an interruption said 0.6 s into the answer -> the last loud
  frame of the interrupted answer (as loadtest/webrtc_bench.py measures it).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np

from ..speech import silence
from ..webrtc_client import Caller
from .stats import BARGE_IN, CONNECT, PROCESSING, VOICE_TO_VOICE, Recorder

PROTOCOL = "WebRTC"
LATE_GAP_S = 0.06
"""A frame is 20 ms; one heard 60 ms after the previous one left an audible gap."""
BARGE_AFTER_S = 0.6
RATE_IN = 16_000


async def _next_speech_start(caller: Caller, before: int) -> float:
    async with asyncio.timeout(10):
        while len(caller.mic.speech_started_at) <= before:  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(0.005)
    return caller.mic.speech_started_at[-1]


def _gaps(caller: Caller, start: float, end: float, rec: Recorder) -> None:
    rec.answer_gaps(PROTOCOL, [t for t, _ in caller.heard if start <= t <= end], LATE_GAP_S)


async def ask(caller: Caller, rec: Recorder, question: np.ndarray, stop: np.ndarray | None) -> None:
    """One question (16 kHz PCM) answered; interrupted by `stop` when given."""
    answers = caller.count("response.created")
    said = len(caller.mic.speech_started_at)
    stopped_before = caller.count("input_audio_buffer.speech_stopped")
    caller.mic.say(np.concatenate([question, silence(100)]))
    last_voiced = await _next_speech_start(caller, said) + len(question) / RATE_IN
    await caller.wait_count("input_audio_buffer.speech_stopped", stopped_before + 1, 30)
    speech_stopped = time.monotonic()
    await caller.wait_count("output_audio_buffer.started", answers + 1, 30)
    await asyncio.sleep(0.1)
    loud = caller.loud_since(last_voiced)
    first = loud[0] if loud else time.monotonic()
    rec.time(PROTOCOL, VOICE_TO_VOICE, (first - last_voiced) * 1000)
    rec.time(PROTOCOL, PROCESSING, max(0.0, first - min(speech_stopped, first)) * 1000)
    if stop is not None:
        await asyncio.sleep(max(0.0, first + BARGE_AFTER_S - time.monotonic()))
        said = len(caller.mic.speech_started_at)
        caller.mic.say(stop)
        sent = await _next_speech_start(caller, said)
        await caller.wait_count("response.created", answers + 2, 15)
        next_reply = time.monotonic()
        old = [t for t in caller.loud_since(sent) if t < next_reply]
        rec.time(PROTOCOL, BARGE_IN, ((old[-1] - sent) if old else 0.0) * 1000)
        rec.count(f"{PROTOCOL} barge_ins")
        _gaps(caller, first, next_reply, rec)
    await caller.wait_count(
        "output_audio_buffer.stopped", caller.count("output_audio_buffer.started"), 30
    )
    if stop is None:
        _gaps(caller, first, time.monotonic(), rec)
    rec.count(f"{PROTOCOL} answers")
    await asyncio.sleep(0.3)


async def rtc_session(
    http_base: str,
    rec: Recorder,
    question: np.ndarray,
    stop: np.ndarray,
    turns: int,
    barge_every: int,
    start: int,
) -> None:
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=http_base, timeout=30) as http:
        secret = await http.post("/v1/realtime/client_secrets", json={"session": {}})
        secret.raise_for_status()
        caller = Caller(http)
        try:
            response = await caller.connect({"Authorization": f"Bearer {secret.json()['value']}"})
            if response.status_code != 201:
                raise RuntimeError(f"call refused: {response.status_code} {response.text[:200]}")
            await caller.wait_for(lambda e: e["type"] == "session.created", 30)
            rec.time(PROTOCOL, CONNECT, (time.monotonic() - began) * 1000)
            for i in range(turns):
                barge = barge_every > 0 and (start + i) % barge_every == barge_every - 1
                await ask(caller, rec, question, stop if barge else None)
            await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
        finally:
            await caller.close()
