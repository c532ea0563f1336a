"""One case of the interruption bench: a Realtime WebSocket session, a question, an answer,
and a sound over it, timed on the client's clock.

The microphone (`MixingMicrophone`) sends 20 ms of PCM16 at 24 kHz each time a real one
would have captured it, for the whole session: steady background noise (faded in over
`FADE_S`, so that the server's noise floor follows it as it would a room's), with the
question and then the sound mixed in where they are scheduled. The capture time of every
sample is known, so the sound's first voiced sample is the bench's zero.

The client plays the answer as a real one would (`Player`): each `response.output_audio
.delta` plays after what is queued before it, at real time. It keeps playing over
`input_audio_buffer.speech_started`: an adaptive-aware client must (the server holds the
answer itself, and a client that dropped its queued audio there would lose it on every
backchannel), and a Parley WebSocket client holds at most the sender's 300 ms lead. It
drops what it holds when the server says the answer was cut (`conversation.item.truncated`
or the response's `response.done` with status `cancelled`, whichever comes first). So:

* cut: the answer's response ended `cancelled`;
* heard: the answer's audio played before the cut (all of it if none);
* last frame: when the client played the answer's last sample (the cut, or its queue
  running dry before it); the cut latency counts from the sound's first voiced sample, 0 if
  no sample of the answer played after it (the model's audio had stalled there).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from .interruption_set import RATE, SPEECH_DBFS, Case, Pcm, pink_noise

CHUNK = RATE // 50
"""20 ms of samples per `input_audio_buffer.append`."""
FADE_S = 1.5
FADE_DB = 30.0
"""The background noise fades in over `FADE_S`, from `FADE_DB` under its level: 0.4 dB a
frame, slower than the server's noise floor rises (0.5 dB a frame), so it is never taken
for speech."""
QUESTION_AT_S = 1.8
"""The question's first sample, from the session's first chunk."""
CASE_TIMEOUT_S = 90.0


class MixingMicrophone:
    """Background noise, with scheduled sounds mixed in, sent at real time until cancelled."""

    def __init__(self, ws: ClientConnection, snr_db: float, seed: int) -> None:
        self._ws = ws
        rng = np.random.default_rng(seed)
        level = 32768 * 10 ** ((SPEECH_DBFS - snr_db) / 20)
        self._noise = pink_noise(RATE * 10, rng) * level
        self._sounds: list[tuple[int, Pcm]] = []
        self._sent = 0
        self.t0 = time.monotonic()
        self.max_lag_s = 0.0

    def sample_at(self, when: float) -> int:
        """The index of the sample captured at `when` (monotonic clock)."""
        return round((when - self.t0) * RATE)

    def time_of(self, sample: int) -> float:
        return self.t0 + sample / RATE

    def schedule(self, pcm: Pcm, when: float) -> float:
        """Mix `pcm` in from the sample captured at `when` (or the next one not sent yet):
        the capture time of its first sample."""
        start = max(self.sample_at(when), self._sent + CHUNK)
        self._sounds.append((start, pcm))
        return self.time_of(start)

    def _chunk(self) -> bytes:
        at = self._sent
        index = np.arange(at, at + CHUNK)
        fade_db = (np.minimum(index / (FADE_S * RATE), 1.0) - 1) * FADE_DB
        mixed = self._noise[index % len(self._noise)] * 10 ** (fade_db / 20)
        for start, pcm in self._sounds:
            lo, hi = max(at, start), min(at + CHUNK, start + len(pcm))
            if lo < hi:
                mixed[lo - at : hi - at] += pcm[lo - start : hi - start]
        return np.clip(mixed, -32768, 32767).astype("<i2").tobytes()

    async def run(self) -> None:
        while True:
            due = self.time_of(self._sent + CHUNK)
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.max_lag_s = max(self.max_lag_s, time.monotonic() - due)
            audio = base64.b64encode(self._chunk()).decode("ascii")
            await self._ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            self._sent += CHUNK


@dataclass
class Player:
    """The client's playback of one response: queued audio plays at real time."""

    received_ms: float = 0.0
    first_at: float | None = None
    end_at: float = 0.0
    """When the last sample received so far will have played."""
    cut_at: float | None = None
    pieces: list[tuple[float, float, float]] = field(default_factory=list)
    """(when it plays, its offset into the answer in ms, its length in ms)."""

    def add(self, at: float, ms: float) -> None:
        if self.cut_at is not None:
            return  # dropped: the answer was cut
        self.first_at = at if self.first_at is None else self.first_at
        start = max(at, self.end_at)
        self.pieces.append((start, self.received_ms, ms))
        self.end_at = start + ms / 1000
        self.received_ms += ms

    def plays_at(self, offset_ms: float) -> float | None:
        """When the answer's `offset_ms` plays (None: not received yet)."""
        for start, offset, ms in self.pieces:
            if offset <= offset_ms < offset + ms:
                return start + (offset_ms - offset) / 1000
        return None

    def cut(self, at: float) -> None:
        self.cut_at = at if self.cut_at is None else self.cut_at

    @property
    def last_frame_at(self) -> float:
        return self.end_at if self.cut_at is None else min(self.end_at, self.cut_at)

    @property
    def heard_ms(self) -> float:
        unplayed = 0.0 if self.cut_at is None else max(0.0, self.end_at - self.cut_at) * 1000
        return self.received_ms - unplayed


@dataclass
class Outcome:
    """What one case did in one mode."""

    case: Case
    mode: str
    cut: bool | None = None
    """The answer was cut (None: the case failed)."""
    heard_ms: float = 0.0
    server_heard_ms: int | None = None
    """`conversation.item.truncated`'s `audio_end_ms`: what the server counts as played."""
    onset_ms: int = 0
    """Where in the answer's audio the sound started (the onset asked, or earlier if the
    answer is shorter)."""
    last_frame_ms: float | None = None
    """From the sound's first voiced sample to the answer's last played sample (0: none
    played after it)."""
    vad_heard: bool = False
    """The server reported speech after the sound started."""
    failure: str | None = None
    mic_lag_ms: float = 0.0
    events: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        sound = self.case.sound
        return {
            "case": self.case.index,
            "mode": self.mode,
            "kind": sound.kind,
            "sound": sound.name,
            "voice": sound.voice,
            "sound_ms": round(sound.ms),
            "interrupt": sound.interrupt,
            "snr_db": self.case.snr_db,
            "onset_ms": self.onset_ms,
            "cut": self.cut,
            "heard_ms": round(self.heard_ms),
            "server_heard_ms": self.server_heard_ms,
            "last_frame_ms": None if self.last_frame_ms is None else round(self.last_frame_ms, 1),
            "vad_heard": self.vad_heard,
            "failure": self.failure,
            "mic_lag_ms": round(self.mic_lag_ms, 1),
        }


def session_update(mode: str, max_output_tokens: int | None) -> dict[str, Any]:
    detection = {"type": "server_vad", "interruption": mode}
    session: dict[str, Any] = {
        "type": "realtime",
        "audio": {"input": {"turn_detection": detection}},
    }
    if max_output_tokens is not None:
        session["max_output_tokens"] = max_output_tokens
    return {"type": "session.update", "session": session}


async def _next_event(ws: ClientConnection, until: float) -> tuple[float, dict[str, Any]]:
    async with asyncio.timeout(max(0.01, until - time.monotonic())):
        raw = await ws.recv()
    event: dict[str, Any] = json.loads(raw)
    if event["type"] == "error":
        raise RuntimeError(f"server error: {event.get('error')}")
    return time.monotonic(), event


async def run_case(
    url: str,
    case: Case,
    mode: str,
    question: Pcm,
    answer_ms: float | None,
    max_output_tokens: int | None = None,
) -> Outcome:
    """`case` in a fresh session with `interruption: mode`: the question, then the sound
    when the client plays the answer's `case.onset_ms` (no later than 1.5 s before an answer
    of `answer_ms` ends; None: no sound, the answer heard whole). The onset is on the
    answer's own timeline: if the answer's audio stalls (the model behind real time), the
    sound still starts over its audio, not over a gap."""
    outcome = Outcome(case, mode)
    async with connect(f"{url}/v1/realtime?model=parley", proxy=None, max_size=None) as ws:
        until = time.monotonic() + 30
        while (await _next_event(ws, until))[1]["type"] != "session.created":
            pass
        await ws.send(json.dumps(session_update(mode, max_output_tokens)))
        while (await _next_event(ws, until))[1]["type"] != "session.updated":
            pass
        mic = MixingMicrophone(ws, case.snr_db, seed=1000 + case.index)
        async with asyncio.TaskGroup() as group:
            sending = group.create_task(mic.run(), name="interruption-bench-mic")
            try:
                await _hear(ws, mic, case, question, answer_ms, outcome)
            except (TimeoutError, RuntimeError) as exc:
                outcome.cut, outcome.failure = None, f"{type(exc).__name__}: {exc}"[:200]
            finally:
                sending.cancel()
        outcome.mic_lag_ms = mic.max_lag_s * 1000
    return outcome


async def _hear(
    ws: ClientConnection,
    mic: MixingMicrophone,
    case: Case,
    question: Pcm,
    answer_ms: float | None,
    outcome: Outcome,
) -> None:
    """The events of one case, until the answer's response is done."""
    mic.schedule(question, mic.t0 + QUESTION_AT_S)
    until = mic.t0 + CASE_TIMEOUT_S
    player = Player()
    answer: str | None = None
    voiced_at: float | None = None
    onset = case.onset_ms
    if answer_ms is not None:
        onset = max(0, min(onset, round(answer_ms) - 1500))
    outcome.onset_ms = onset
    while True:
        at, event = await _next_event(ws, until)
        kind = event["type"]
        outcome.events.append(kind)
        if kind == "response.output_audio.delta":
            if answer is None:
                answer = event["response_id"]
            if event["response_id"] == answer:
                player.add(at, len(base64.b64decode(event["delta"])) / 2 / RATE * 1000)
                plays_at = player.plays_at(onset)
                if answer_ms is not None and voiced_at is None and plays_at is not None:
                    voiced_at = mic.schedule(case.sound.pcm, max(at, plays_at))
        elif kind == "input_audio_buffer.speech_started":
            outcome.vad_heard |= voiced_at is not None and at >= voiced_at
        elif kind == "conversation.item.truncated" and answer is not None:
            player.cut(at)
            outcome.server_heard_ms = event["audio_end_ms"]
        elif kind == "response.done" and event["response"]["id"] == answer:
            status = event["response"]["status"]
            if answer_ms is not None and voiced_at is None:
                raise RuntimeError(f"the answer ended ({status}) before the sound's onset")
            if status == "cancelled":
                player.cut(at)
            if voiced_at is not None and player.first_at is not None:
                if status == "cancelled" and at < voiced_at:
                    raise RuntimeError("the answer was cut before the sound started")
                outcome.last_frame_ms = max(0.0, player.last_frame_at - voiced_at) * 1000
            outcome.cut = status == "cancelled"
            outcome.heard_ms = player.heard_ms
            if outcome.cut and outcome.server_heard_ms is None:
                outcome.server_heard_ms = await _truncated_at(ws, min(until, at + 2.0))
            return


async def _truncated_at(ws: ClientConnection, until: float) -> int | None:
    """The `audio_end_ms` of the `conversation.item.truncated` that follows a cut answer's
    `response.done` (None if it does not come by `until`)."""
    with contextlib.suppress(TimeoutError):
        while True:
            _, event = await _next_event(ws, until)
            if event["type"] == "conversation.item.truncated":
                return int(event["audio_end_ms"])
    return None
