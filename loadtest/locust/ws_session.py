"""An OpenAI Realtime WebSocket user: connect, ask spoken questions, barge in, hang up.

The microphone is the voice benchmark's (`loadtest.voice_mic`): 24 kHz PCM16 appended in
20 ms chunks at the pace a microphone captures them, noise between words, server VAD ending
the turn. Figures, on the client's clock:

- connect: socket opened -> `session.created`;
- voice_to_voice: the last voiced sample of the question -> the first answer audio delta;
- processing: `input_audio_buffer.speech_stopped` -> the first answer audio delta;
- chunk_lag: per answer audio delta, how much later it arrived than real-time playback from
  the answer's first delta would need it (0 when early): the server's pacing under load;
- barge_in: the first voiced sample of an interruption said 0.6 s into the answer -> the
  end of the interrupted answer's audio as a client plays it: each delta queued at real
  time after the one before (or when it arrives, if later), and the playback cleared when
  `input_audio_buffer.speech_started` arrives, as OpenAI tells WebSocket clients to do.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection, connect

from pipeline.tasks import TaskSet

from ..voice_mic import RATE, Microphone, Pcm
from .inbox import Inbox
from .stats import BARGE_IN, CHUNK_LAG, CONNECT, PROCESSING, VOICE_TO_VOICE, Recorder

PROTOCOL = "WS"
TAIL_MS = 1200
"""Noise after each question: the server VAD's 500 ms of silence, and some."""
BARGE_AFTER_S = 0.6
"""How far into an answer the interruption starts."""


@dataclass(frozen=True, slots=True)
class Speech:
    """What a user says: the question (and its text), the interruption."""

    question: Pcm
    question_text: str
    stop: Pcm


async def _read(ws: ClientConnection, inbox: Inbox) -> None:
    async for raw in ws:
        inbox.put(time.monotonic(), json.loads(raw))


def _played_until(inbox: Inbox, mark: int, response_id: str | None, after: float) -> float:
    """When a client's speaker, busy until `after`, would finish `response_id`'s audio."""
    speaker = after
    for s in inbox.since(mark, "response.output_audio.delta"):
        if s.event.get("response_id") == response_id:
            speaker = max(speaker, s.at) + len(base64.b64decode(s.event["delta"])) / 2 / RATE
    return speaker


class WsCall:
    def __init__(self, ws: ClientConnection, rec: Recorder) -> None:
        self.ws, self.rec = ws, rec
        self.mic = Microphone(ws)
        self.inbox = Inbox()

    async def ask(self, speech: Speech, barge: bool) -> None:
        """One question answered (interrupted when `barge`); an uninterrupted answer's audio
        is offered to the recorder for the quality figure."""
        mark = self.inbox.mark()
        last_voiced = self.mic.say(speech.question, tail_ms=TAIL_MS)
        stopped = await self.inbox.wait(
            lambda e: e["type"] == "input_audio_buffer.speech_stopped", mark, 30
        )
        created = await self.inbox.wait_type("response.created", mark, 30)
        response_id = created.event.get("response", {}).get("id")
        first = await self.inbox.wait(
            lambda e: (
                e["type"] == "response.output_audio.delta" and e.get("response_id") == response_id
            ),
            mark,
            30,
        )
        self.rec.time(PROTOCOL, VOICE_TO_VOICE, (first.at - last_voiced) * 1000)
        self.rec.time(PROTOCOL, PROCESSING, (first.at - max(stopped.at, last_voiced)) * 1000)
        if barge:
            await asyncio.sleep(max(0.0, first.at + BARGE_AFTER_S - time.monotonic()))
            barge_mark = self.inbox.mark()
            said_until = self.mic.say(speech.stop, tail_ms=TAIL_MS)
            stop_start = said_until - len(speech.stop) / RATE
        done = await self.inbox.wait(
            lambda e: (
                e["type"] == "response.done"
                and e.get("response", {}).get("id", response_id) == response_id
            ),
            mark,
            60,
        )
        deltas = [
            s
            for s in self.inbox.since(mark, "response.output_audio.delta")
            if s.event.get("response_id") == response_id and s.at <= done.at
        ]
        chunks = [base64.b64decode(s.event["delta"]) for s in deltas]
        played, speaker = 0.0, first.at
        for s, chunk in zip(deltas, chunks, strict=True):
            self.rec.time(PROTOCOL, CHUNK_LAG, max(0.0, s.at - (first.at + played)) * 1000)
            played += len(chunk) / 2 / RATE
            speaker = max(speaker, s.at) + len(chunk) / 2 / RATE  # a client's playback queue
        self.rec.count(f"{PROTOCOL} answers")
        if barge:
            # A client stops its playback when the server hears the interruption start.
            heard = self.inbox.since(barge_mark, "input_audio_buffer.speech_started")
            end = min(speaker, heard[0].at) if heard else speaker
            self.rec.time(PROTOCOL, BARGE_IN, max(0.0, end - stop_start) * 1000)
            self.rec.count(f"{PROTOCOL} barge_ins")
            # The interruption is a turn of its own: let its answer play out.
            other = await self.inbox.wait(
                lambda e: (
                    e["type"] == "response.done" and e.get("response", {}).get("id") != response_id
                ),
                mark,
                60,
            )
            speaker = _played_until(self.inbox, mark, other.event["response"].get("id"), speaker)
        else:
            self.rec.clip(PROTOCOL, speech.question_text, b"".join(chunks))
        self.rec.count(f"{PROTOCOL} answer_audio_s", played)
        # Wait for the answer to have played (in real time) before the next question.
        await asyncio.sleep(max(0.0, speaker - time.monotonic()))


async def ws_session(
    ws_base: str, rec: Recorder, speech: Speech, turns: int, barge_every: int, start: int
) -> None:
    """One session of `turns` questions; answer number `start + i` is interrupted when it is
    `barge_every - 1` modulo `barge_every`."""
    began = time.monotonic()
    async with connect(f"{ws_base}/v1/realtime?model=parley", proxy=None, max_size=None) as ws:
        call = WsCall(ws, rec)
        async with TaskSet("ws-session") as tasks:  # the reader and the microphone
            tasks.create_task(_read(ws, call.inbox))
            await call.inbox.wait_type("session.created", 0, 30)
            rec.time(PROTOCOL, CONNECT, (time.monotonic() - began) * 1000)
            tasks.create_task(call.mic.run())
            for i in range(turns):
                barge = barge_every > 0 and (start + i) % barge_every == barge_every - 1
                await call.ask(speech, barge)
