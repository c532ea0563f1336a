"""The answer's way out on a Twilio Media Stream, and what the caller has played of it.

An OutputSink's audio half: the session's answer goes through a PlayoutBuffer at 8 kHz and
out as `media` messages paced at real time with a small lead (`LEAD_MS`: Twilio buffers
it), with a `mark` after every `MARK_EVERY_MS` of audio and when sending stops (paused, or
the answer has ended). Twilio echoes each mark once the audio before it has been played,
so the playback cursor the session truncates at is what the caller heard
(twilio_marks.py), not what was sent.

Barge-in: the session pauses the sink when speech starts over the answer (nothing more is
sent; Twilio plays out its short lead) and clears it when the speech is accepted as an
interruption; noise ends in a resume and sends nothing. `clear()` sends Twilio's `clear`
whenever the caller may still have audio to play: audio queued here, or sent and not yet
echoed, which is also the case once the whole answer has been sent and Twilio is playing
its buffer (`drained()` waits for the echoes, so the answer is still in progress then).
A caller that never echoes marks is taken to have played everything `MARK_GRACE_S` after
its audio should have ended.

One task sends (`send_answer`), so `clear` and audio go out in order; the transport gives
it `send()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sessions import PlayoutBuffer, PlayoutSink

from ..g711 import ulaw_encode
from .twilio_marks import MarkLedger
from .twilio_messages import SAMPLE_RATE, clear_message, mark_message, media_message

log = logging.getLogger("parley.realtime.twilio")

LEAD_MS = 200
"""How far ahead of the caller's playback the answer is sent."""
MARK_EVERY_MS = 100
"""Audio between two marks: the played position's resolution."""
MARK_IDLE_MS = 60
"""When no audio follows, a stretch's mark goes out this long before it has played."""
MARK_GRACE_S = 2.0
"""How long past its expected end an answer's marks may take to come back."""
PLAYOUT_MS = 2_000


class TwilioPlayout(PlayoutSink):
    def __init__(self) -> None:
        super().__init__(PlayoutBuffer(SAMPLE_RATE, PLAYOUT_MS, on_change=self._wake_sender))
        self.stream_sid = ""
        self.marks = MarkLedger()
        self.clears_sent = 0
        self.stopped = asyncio.Event()
        """Set when the stream ends: nothing more will be played or echoed."""
        self._wake = asyncio.Event()
        self._echo = asyncio.Event()
        self._clear_due = False
        self._play_end = time.monotonic()
        """When the caller will have played everything sent (by the wall clock)."""

    async def send(self, message: dict[str, Any]) -> bool:
        """Send one message to the caller; False once it has gone."""
        raise NotImplementedError

    def echoed(self, name: str) -> None:
        """The caller's `mark`: it has played the audio up to mark `name`."""
        self.marks.echoed(name)
        self._echo.set()

    # --- sending ------------------------------------------------------------------------

    def _lead_s(self) -> float:
        return self._play_end - time.monotonic()

    async def send_answer(self) -> None:
        """The one sender: `clear` first when due, then audio while the lead is short,
        each stretch closed by a mark."""
        while True:
            self._wake.clear()
            if self._clear_due:
                self._clear_due = False
                self.clears_sent += 1
                if not await self.send(clear_message(self.stream_sid)):
                    return
            piece = self.playout.take() if self._lead_s() < LEAD_MS / 1000 else None
            if piece is not None:
                self._play_end = max(time.monotonic(), self._play_end) + piece.ms / 1000
                self.marks.sent(piece.ms)
                due = self.marks.unmarked_ms >= MARK_EVERY_MS
                name = self.marks.mark() if due else None
                if not await self.send(media_message(self.stream_sid, ulaw_encode(piece.pcm))):
                    return
                if name is not None and not await self.send(mark_message(self.stream_sid, name)):
                    return
                continue
            name = self.marks.mark() if self._stretch_ends() else None
            if name is not None and not await self.send(mark_message(self.stream_sid, name)):
                return
            try:
                async with asyncio.timeout(self._next_wake_s()):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _stretch_ends(self) -> bool:
        """Whether the audio sent since the last mark gets its mark now that nothing more
        is being sent: at once when paused, else once the caller is about to play the last
        of it (more may still come: an answer arriving slower than real time)."""
        if self.marks.unmarked_ms <= 0 or (self.playout.queued_pieces and not self.playout.paused):
            return False
        return self.playout.paused or self._lead_s() <= MARK_IDLE_MS / 1000

    def _next_wake_s(self) -> float | None:
        """When the sender has something to do unless woken before: the lead falls short
        (audio is queued), or an unmarked stretch is about to end."""
        if self.playout.queued_pieces and not self.playout.paused:
            return max(0.002, self._lead_s() - LEAD_MS / 1000)
        if self.marks.unmarked_ms > 0:
            return max(0.002, self._lead_s() - MARK_IDLE_MS / 1000)
        return None

    def _wake_sender(self) -> None:
        self._wake.set()

    # --- OutputSink ----------------------------------------------------------------------

    def clear(self) -> None:
        """Barge-in: drop what is queued here and, when the caller may still be playing
        some of the answer, what Twilio holds (`clear`, sent next)."""
        owed = self.playout.queued_ms > 0 or self.marks.outstanding_ms > 0
        super().clear()
        self.marks.clear()
        self._echo.set()
        self._play_end = time.monotonic()
        if owed and self.stream_sid:
            self._clear_due = True
            self._wake.set()

    @property
    def played_ms(self) -> int:
        return self.marks.played_ms

    async def drained(self) -> None:
        """Everything written has been played: sent, and its marks echoed."""
        await self.playout.drained()
        while self.marks.outstanding_ms > 0 and not self.stopped.is_set():
            left = self._play_end + MARK_GRACE_S - time.monotonic()
            if left <= 0:
                log.info("stream %s: marks not echoed; taken as played", self.stream_sid)
                self.marks.assume_played()
                return
            self._echo.clear()
            try:
                async with asyncio.timeout(left):
                    await self._echo.wait()
            except TimeoutError:
                pass
