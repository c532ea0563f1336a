"""The outbound side of one WebSocket connection, and a session OutputSink base.

A WebSocket has no media clock: whatever we write, the client buffers. So we keep the
client's buffer small on purpose. Audio is queued in the session's one playout engine
(`sessions.playout.PlayoutBuffer`, in ~100 ms pieces) and events (JSON-ready dicts) beside
it, in one order: each event remembers the audio queued before it. A single sender task
writes events as they come and audio paced at real time plus a small lead (300 ms by
default). The client then never holds much more than the lead, which makes "sent" a fair
estimate of "played": `played_ms`, the engine's cursor, counts the audio handed to the
socket, and a barge-in truncates the answer there.

- `clear()` drops queued audio at once, and the rest of a write it interrupted; queued
  events stay (they say what happened).
- `pause()` holds audio. Events keep flowing past held audio, except those posted with
  `after_audio=True` (e.g. `response.done`), which never overtake audio queued before them.
- `audio()` waits while more than ~2 s is queued: backpressure to the model.
- A client that cannot keep up (its socket write blocks) fills the queue. The queue (audio
  pieces and events together) is bounded: the oldest audio goes first, counted in
  `dropped_audio`. If only events are
  left there is nothing safe to drop, so `run()` raises `SlowClientError` and the owner
  ends the connection; memory stays bounded either way.
- The client's own messages must not fill the queue either: a reader that has a burst of
  them buffered applies them without ever yielding to the sender, and each may earn a
  reply (a `pong`, a `session.updated`). So the owner's reader awaits `input_room()`
  before each message: it returns at once while the queue is less than half full, else
  once the sender has caught up (the reader stops reading, and TCP slows the client
  down). A queue that stays half full for `stall_s` means the client is not reading:
  `input_room()` raises `SlowClientError`; so does `run()` when one write blocks that
  long (the socket's buffers are full), since a full queue is only noticed between writes.

With `silence_ms` set (GPT-Live's output never pauses), the sender fills every gap in the
audio with silence pieces of that length, keeping at most `SILENCE_AHEAD_S` of them ahead
of the client's clock, so an answer that arrives plays after at most that much silence.
Silence is never counted as played answer audio, and `drained()` does not wait for it.

Encoding is the owner's: `send` writes one JSON-ready message, `audio_message` turns one
PCM16 piece into its wire message (a `response.output_audio.delta`, a WAV delta, ...).
`event()` is the one OutputSink method left to subclasses: they turn a session event into
wire messages and `post()` them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sessions import PlayoutBuffer, PlayoutSink
from sessions.events import Event

from ...slow_clients import DEFAULT_STALL_S

log = logging.getLogger("parley.realtime.websocket.sender")

Message = dict[str, Any]
SendFn = Callable[[Message], Awaitable[None]]
AudioMessageFn = Callable[[npt.NDArray[np.int16], int], Message]

DEFAULT_LEAD_MS = 300
DEFAULT_PIECE_MS = 100
DEFAULT_MAX_ITEMS = 512
DEFAULT_MAX_QUEUED_MS = 2_000
SILENCE_AHEAD_S = 0.06
"""Silence the client may hold ahead of its clock (the most an answer waits behind it)."""


class SlowClientError(Exception):
    """The client stopped reading: the outbound queue is full of events it has not taken."""


@dataclass(slots=True)
class _Post:
    message: Message
    after_audio: bool
    after_piece: int
    """The playout's `pieces_added` when it was posted: the audio queued before it."""


class PacedSender(PlayoutSink):
    def __init__(
        self,
        send: SendFn,
        audio_message: AudioMessageFn,
        *,
        lead_ms: int = DEFAULT_LEAD_MS,
        piece_ms: int = DEFAULT_PIECE_MS,
        max_items: int = DEFAULT_MAX_ITEMS,
        max_queued_ms: int = DEFAULT_MAX_QUEUED_MS,
        stall_s: float = DEFAULT_STALL_S,
        silence_ms: int = 0,
        sample_rate: int | None = None,
    ) -> None:
        # `sample_rate`: the client's output rate, other rates resampled as one stream per
        # response (the playout's); None: each piece goes out at the rate it was written
        # (the wire message says its rate).
        super().__init__(
            PlayoutBuffer(
                sample_rate,
                max_queued_ms,
                piece_ms=piece_ms,
                admit=self._admit_audio,
                on_change=self._playout_changed,
            )
        )
        self._send = send
        self._audio_message = audio_message
        self.lead_s = lead_ms / 1000
        self.piece_ms = piece_ms
        self.max_items = max_items
        self.max_queued_ms = max_queued_ms
        self.stall_s = stall_s
        self._events: collections.deque[_Post] = collections.deque()
        self._play_end = 0.0
        """Monotonic time by which the client has played all audio sent (if it plays on
        receipt); pacing keeps this at most `lead` ahead of now."""
        self._answer_end = 0.0
        """The same for the last answer audio sent (silence after it not counted)."""
        self.silence_ms = silence_ms
        self.silence_rate = 24_000
        """The rate silence is made at: the client's own (resampling would dither it)."""
        self._silence: Message | None = None
        self._wake = asyncio.Event()
        self._audio_sent = asyncio.Event()
        self._audio_sent.set()
        """Clear while a piece taken from the playout is being written."""
        self._empty = asyncio.Event()
        self._empty.set()
        self._input_room = asyncio.Event()
        self._input_room.set()
        self._in_flight = False
        self.closed = False
        self._overflow = False
        self.dropped_audio = 0
        self.dropped_events = 0

    # --- state -----------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self.playout.paused

    @property
    def queued_ms(self) -> int:
        return self.playout.queued_ms

    @property
    def queued_items(self) -> int:
        return len(self._events) + self.playout.queued_pieces

    # --- OutputSink --------------------------------------------------------------------------
    # audio(), pause(), resume() and played_ms are the playout's (PlayoutSink): audio()
    # waits while more than `max_queued_ms` is queued; audio arriving after `close()`, or
    # cut off by `clear()`, is dropped; played_ms counts the audio sent since creation.

    def event(self, event: Event) -> None:
        """Subclasses turn a session event into wire messages and `post()` them."""
        raise NotImplementedError

    def clear(self) -> None:
        """Drop all queued audio at once; queued events stay."""
        super().clear()
        now = time.monotonic()  # the client flushes too
        self._play_end, self._answer_end = min(self._play_end, now), min(self._answer_end, now)

    async def drained(self) -> None:
        """Return once all queued audio is sent and, by the pacing clock, played."""
        while True:
            await self.playout.drained()
            await self._audio_sent.wait()
            remaining = self._answer_end - time.monotonic()
            if remaining > 0:
                await asyncio.sleep(remaining)
            elif not self.playout.queued_pieces and self._audio_sent.is_set():
                return

    async def flushed(self) -> None:
        """Return once everything queued so far is sent (or dropped)."""
        await self._empty.wait()

    async def input_room(self) -> None:
        """The reader's backpressure: return once the queue is less than half full (at
        once, without yielding, when it is). Raises SlowClientError when it stays half
        full for `stall_s`."""
        if self._input_room.is_set():
            return
        try:
            async with asyncio.timeout(self.stall_s):
                await self._input_room.wait()
        except TimeoutError:
            raise SlowClientError(
                f"outbound queue over half full ({self.queued_items} items) for "
                f"{self.stall_s:g} s: the client is not reading"
            ) from None

    # --- events ------------------------------------------------------------------------------

    def post(self, message: Message, *, after_audio: bool = False) -> None:
        """Queue one wire event; never blocks. `after_audio`: never overtake audio queued
        before it, even while paused (an end-of-response event)."""
        if self.closed:
            return
        self.playout.seal()  # audio written after this event goes after it
        if self.queued_items >= self.max_items and not self._drop_oldest_audio():
            self.dropped_events += 1
            self._overflow = True
            self._wake.set()
            return
        self._events.append(_Post(message, after_audio, self.playout.pieces_added))
        self._empty.clear()
        self._check_room()
        self._wake.set()

    def close(self) -> None:
        """Stop taking output; a waiting `audio()` or `input_room()` returns. Idempotent."""
        self.closed = True
        self.playout.close()
        self._input_room.set()
        self._wake.set()

    # --- the sender task ---------------------------------------------------------------------

    async def run(self) -> None:
        """Send until cancelled by the owner; raises SlowClientError on overflow and
        whatever `send` raises (the connection is gone)."""
        while True:
            self._wake.clear()
            if self._overflow:
                raise SlowClientError(
                    f"outbound queue full ({self.max_items} items): the client is not reading"
                )
            post = self._next_event()
            if post is not None:
                self._events.popleft()
                self._check_room()
                await self._sending(post.message)
                continue
            if self.playout.paused or not self.playout.queued_pieces:
                if self.silence_ms and not self.closed:
                    await self._fill_silence()
                else:
                    await self._wake.wait()
                continue
            delay = self._play_end - self.lead_s - time.monotonic()
            if delay > 0:
                try:  # woken early by clear/pause/new items: look again
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            self._in_flight = True  # before take(): flushed() must not see an empty queue
            piece = self.playout.take()
            if piece is None:
                self._in_flight = False
                continue
            self._audio_sent.clear()
            await self._sending(self._audio_message(piece.pcm, piece.rate))
            self._play_end = max(self._play_end, time.monotonic()) + piece.ms / 1000
            self._answer_end = self._play_end
            self._audio_sent.set()  # only now: drained() must see this piece's play time

    async def _fill_silence(self) -> None:
        """Nothing to play: one piece of silence when the client's buffer runs low, else
        wait for that moment (or for something else to send)."""
        delay = self._play_end - SILENCE_AHEAD_S - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            return
        if self._silence is None:
            quiet = np.zeros(self.silence_rate * self.silence_ms // 1000, dtype=np.int16)
            self._silence = self._audio_message(quiet, self.silence_rate)
        await self._sending(dict(self._silence))
        self._play_end = max(self._play_end, time.monotonic()) + self.silence_ms / 1000

    async def _sending(self, message: Message) -> None:
        self._in_flight = True
        try:
            async with asyncio.timeout(self.stall_s) as deadline:
                await self._send(message)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise SlowClientError(
                f"one message could not be written for {self.stall_s:g} s: the client is "
                "not reading"
            ) from None
        finally:
            self._in_flight = False
            self._check_empty()

    def _next_event(self) -> _Post | None:
        """The first queued event if it goes next: no audio queued before it, or playback
        paused and it need not wait for that audio."""
        if not self._events:
            return None
        first = self._events[0]
        if self.playout.pieces_removed >= first.after_piece:
            return first
        if self.playout.paused and not first.after_audio:
            return first
        return None

    def _check_empty(self) -> None:
        if self.queued_items:
            self._empty.clear()
        elif not self._in_flight:
            self._empty.set()

    def _check_room(self) -> None:
        """`input_room()` is open while the queue is less than half full (or closed)."""
        if self.queued_items < self.max_items // 2 or self.closed:
            self._input_room.set()
        else:
            self._input_room.clear()

    def _admit_audio(self) -> bool:
        """The playout asks before queuing a new piece: room in the queue, made by dropping
        the oldest audio if need be; with only events left, the piece is dropped."""
        if self.queued_items < self.max_items or self._drop_oldest_audio():
            return True
        self.dropped_audio += 1
        self._overflow = True
        self._wake.set()
        return False

    def _drop_oldest_audio(self) -> bool:
        if not self.playout.drop_oldest():
            return False
        self.dropped_audio += 1
        return True

    def _playout_changed(self) -> None:
        self._check_empty()
        self._check_room()
        self._wake.set()
