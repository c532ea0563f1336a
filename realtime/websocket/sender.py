"""The outbound side of one WebSocket connection, and a session OutputSink base.

A WebSocket has no media clock: whatever we write, the client buffers. So we keep the
client's buffer small on purpose. One ordered, bounded queue holds everything going out,
events (JSON-ready dicts) and audio; a single sender task writes events as they come and
audio in ~100 ms pieces, paced at real time plus a small lead (300 ms by default). The
client then never holds much more than the lead, which makes "sent" a fair estimate of
"played": `played_ms` counts the audio sent, and a barge-in truncates the answer there.

- `clear()` drops queued audio at once; queued events stay (they say what happened).
- `pause()` holds audio. Events keep flowing past held audio, except those posted with
  `after_audio=True` (e.g. `response.done`), which never overtake audio queued before them.
- `audio()` waits while more than ~2 s is queued: backpressure to the model.
- A client that cannot keep up (its socket write blocks) fills the queue. The queue is
  bounded: the oldest audio goes first, counted in `dropped_audio`. If only events are
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

Encoding is the owner's: `send` writes one JSON-ready message, `audio_message` turns one
PCM16 piece into its wire message (a `response.output_audio.delta`, a WAV delta, ...).
`event()` is the one OutputSink method left to subclasses: they turn a session event into
wire messages and `post()` them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sessions.events import Event

log = logging.getLogger("parley.realtime.websocket.sender")

Message = dict[str, Any]
SendFn = Callable[[Message], Awaitable[None]]
AudioMessageFn = Callable[[npt.NDArray[np.int16], int], Message]

DEFAULT_LEAD_MS = 300
DEFAULT_PIECE_MS = 100
DEFAULT_MAX_ITEMS = 512
DEFAULT_MAX_QUEUED_MS = 2_000
DEFAULT_STALL_S = 10.0


class SlowClientError(Exception):
    """The client stopped reading: the outbound queue is full of events it has not taken."""


@dataclass(slots=True)
class _Audio:
    pcm: npt.NDArray[np.int16]
    rate: int

    @property
    def ms(self) -> float:
        return len(self.pcm) * 1000 / self.rate


@dataclass(slots=True)
class _Post:
    message: Message
    after_audio: bool


class PacedSender:
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
    ) -> None:
        self._send = send
        self._audio_message = audio_message
        self.lead_s = lead_ms / 1000
        self.piece_ms = piece_ms
        self.max_items = max_items
        self.max_queued_ms = max_queued_ms
        self.stall_s = stall_s
        self._queue: collections.deque[_Audio | _Post] = collections.deque()
        self._audio_items = 0
        self._queued_ms = 0.0
        self._sent_ms = 0.0
        self._play_end = 0.0
        """Monotonic time by which the client has played all audio sent (if it plays on
        receipt); pacing keeps this at most `lead` ahead of now."""
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._no_audio = asyncio.Event()
        self._no_audio.set()
        self._empty = asyncio.Event()
        self._empty.set()
        self._input_room = asyncio.Event()
        self._input_room.set()
        self._in_flight = False
        self._generation = 0
        """Bumped by clear(): an audio() call that was waiting drops the rest of its audio."""
        self.paused = False
        self.closed = False
        self._overflow = False
        self.dropped_audio = 0
        self.dropped_events = 0

    # --- state -----------------------------------------------------------------------------

    @property
    def played_ms(self) -> int:
        """Milliseconds of audio sent since this sender was created."""
        return int(self._sent_ms)

    @property
    def queued_ms(self) -> int:
        return int(self._queued_ms)

    @property
    def queued_items(self) -> int:
        return len(self._queue)

    # --- OutputSink --------------------------------------------------------------------------

    def event(self, event: Event) -> None:
        """Subclasses turn a session event into wire messages and `post()` them."""
        raise NotImplementedError

    async def audio(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        """Queue audio in pieces of `piece_ms`; waits while more than `max_queued_ms` is
        queued. Audio arriving after `close()`, or cut off by `clear()`, is dropped."""
        pcm = pcm.astype(np.int16, copy=False).reshape(-1)
        piece = max(1, sample_rate * self.piece_ms // 1000)
        generation = self._generation
        start = 0
        while start < len(pcm) and not self.closed:
            while self._queued_ms >= self.max_queued_ms and not self.closed:
                self._room.clear()
                await self._room.wait()
            if self.closed or generation != self._generation:
                return
            last = self._queue[-1] if self._queue else None
            if isinstance(last, _Audio) and last.rate == sample_rate and len(last.pcm) < piece:
                take = min(piece - len(last.pcm), len(pcm) - start)  # coalesce small chunks
                last.pcm = np.concatenate([last.pcm, pcm[start : start + take]])
                self._queued_ms += take * 1000 / sample_rate
            else:
                take = min(piece, len(pcm) - start)
                self._push(_Audio(pcm[start : start + take].copy(), sample_rate))
            start += take

    def clear(self) -> None:
        """Drop all queued audio at once; queued events stay."""
        if self._audio_items:
            self._queue = collections.deque(i for i in self._queue if isinstance(i, _Post))
        self._audio_items = 0
        self._queued_ms = 0.0
        self._generation += 1
        self._play_end = min(self._play_end, time.monotonic())  # the client flushes too
        self._no_audio.set()
        self._room.set()
        self._wake.set()
        self._check_empty()
        self._check_room()

    def pause(self) -> None:
        self.paused = True
        self._wake.set()

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    async def drained(self) -> None:
        """Return once all queued audio is sent and, by the pacing clock, played."""
        while True:
            await self._no_audio.wait()
            remaining = self._play_end - time.monotonic()
            if remaining <= 0:
                if self._no_audio.is_set():
                    return
                continue
            await asyncio.sleep(remaining)

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
                f"outbound queue over half full ({len(self._queue)} items) for "
                f"{self.stall_s:g} s: the client is not reading"
            ) from None

    # --- events ------------------------------------------------------------------------------

    def post(self, message: Message, *, after_audio: bool = False) -> None:
        """Queue one wire event; never blocks. `after_audio`: never overtake audio queued
        before it, even while paused (an end-of-response event)."""
        if not self.closed:
            self._push(_Post(message, after_audio))

    def close(self) -> None:
        """Stop taking output; a waiting `audio()` or `input_room()` returns. Idempotent."""
        self.closed = True
        self._room.set()
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
            index = self._next_index()
            if index is None:
                await self._wake.wait()
                continue
            item = self._queue[index]
            if isinstance(item, _Post):
                del self._queue[index]
                self._check_room()
                await self._sending(item.message)
                continue
            delay = self._play_end - self.lead_s - time.monotonic()
            if delay > 0:
                try:  # woken early by clear/pause/new items: look again
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            del self._queue[index]
            self._check_room()
            self._audio_items -= 1
            self._queued_ms = max(0.0, self._queued_ms - item.ms)
            if self._queued_ms < self.max_queued_ms:
                self._room.set()
            await self._sending(self._audio_message(item.pcm, item.rate))
            self._sent_ms += item.ms
            self._play_end = max(self._play_end, time.monotonic()) + item.ms / 1000
            if not self._audio_items:  # only now: drained() must see this piece's play time
                self._no_audio.set()

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

    def _check_empty(self) -> None:
        if not self._queue and not self._in_flight:
            self._empty.set()

    def _check_room(self) -> None:
        """`input_room()` is open while the queue is less than half full (or closed)."""
        if len(self._queue) < self.max_items // 2 or self.closed:
            self._input_room.set()
        else:
            self._input_room.clear()

    def _next_index(self) -> int | None:
        """Where the next item to send is: the head, or while paused the first event
        not held behind audio."""
        if not self._queue:
            return None
        if not self.paused:
            return 0
        seen_audio = False
        for index, item in enumerate(self._queue):
            if isinstance(item, _Audio):
                seen_audio = True
            elif item.after_audio and seen_audio:
                return None
            else:
                return index
        return None

    def _push(self, item: _Audio | _Post) -> None:
        if len(self._queue) >= self.max_items and not self._drop_oldest_audio():
            if isinstance(item, _Audio):
                self.dropped_audio += 1
            else:
                self.dropped_events += 1
            self._overflow = True
            self._wake.set()
            return
        self._queue.append(item)
        self._empty.clear()
        self._check_room()
        if isinstance(item, _Audio):
            self._audio_items += 1
            self._queued_ms += item.ms
            self._no_audio.clear()
        self._wake.set()

    def _drop_oldest_audio(self) -> bool:
        for index, item in enumerate(self._queue):
            if isinstance(item, _Audio):
                del self._queue[index]
                self._audio_items -= 1
                self._queued_ms = max(0.0, self._queued_ms - item.ms)
                self.dropped_audio += 1
                if not self._audio_items:
                    self._no_audio.set()
                return True
        return False
