"""A session's stream on the duplex engine, shared by two threads: the server's event loop
(the transport feeds the microphone in and reads the voice out) and the engine's clock,
which runs on the model's thread (duplex_engine.py).

The microphone's frames wait in a bounded inbox and the model's voice in a bounded outbox,
each behind the session's lock; the loop side never waits on a frame, only on that lock,
which the clock holds for a few list operations. The clock puts a frame in the outbox and
the engine wakes the reader on the loop (`wake`, through `call_soon_threadsafe`, once a
frame for all its sessions). A session that the model failed under (its own bad input, or
the whole clock) is ended with the reason, and its reader gets `DuplexFailed` after the
frames it had.

The inbox is watched as a jitter buffer is: when frames have been waiting at every tick
for a second (a standing queue, not a burst that drains), the quietest of them are dropped
down to one, counted in `stats.skipped_in` (duplex_engine.py says why).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ...duplex import DuplexFailed
from .mimi_frames import FRAME_SAMPLES

INBOX_FRAMES = 25
"""Microphone frames a session may have waiting (2 s); past this the oldest are dropped."""
OUTBOX_FRAMES = 50
"""Voice frames waiting for a slow reader (4 s); past this the oldest are dropped."""
STANDING_TICKS = 12
"""Ticks (~1 s) an inbox must never have drained to one frame before it is cut back."""
RECENT_STEPS = 2048
"""Per-step timings the engine keeps (`DuplexStats.recent`), for benchmarks and metrics."""

Pcm = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class VoiceFrame:
    index: int
    """The session's frame number, from 0, without gaps."""
    pcm: Pcm
    """1,920 samples at 24 kHz (silence before the model's first whole frame)."""
    text: int
    """The text token the model wrote with this frame."""
    words: str = ""
    """What that token adds to the model's transcript ("" for padding, or no tokenizer)."""
    heard: int = 0
    """Microphone frames the model had taken when it made this frame, heard or cut from a
    standing queue (its latency as a client hears it: loadtest/duplex_latency.py)."""


@dataclass(frozen=True, slots=True)
class StepTimes:
    """One tick's work, in ms: what a late frame spent its time on."""

    at: float
    """When the tick's work began (the engine's clock)."""
    sessions: int
    rows: float
    """Joins and leaves applied before the frame."""
    encode: float
    step: float
    decode: float
    total: float
    """The tick's whole work as the clock saw it."""


@dataclass
class DuplexStats:
    steps: int = 0
    late_steps: int = 0
    worst_late_ms: float = 0.0
    failed_steps: int = 0
    """Frames whose work raised (logged; their sessions got no frame for that tick)."""
    failed_sessions: int = 0
    """Sessions ended by their own bad input or row (the others went on)."""
    unheard_frames: int = 0
    """Frames a session's microphone had not supplied in time (heard as silence)."""
    dropped_in: int = 0
    skipped_in: int = 0
    """Microphone frames dropped from a standing queue so the model hears the user live."""
    dropped_out: int = 0
    recent: collections.deque[StepTimes] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_STEPS)
    )

    @property
    def step_ms_last(self) -> float:
        """The last tick's whole work in ms (0 before the first)."""
        return self.recent[-1].total if self.recent else 0.0


def as_pcm(pcm: object) -> Pcm:
    """Microphone audio as 1-D PCM16; ValueError for anything else (a clear error at the
    door, not a failed frame later)."""
    array = np.asarray(pcm)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"a duplex stream takes 1-D PCM16 samples, not an array of shape {array.shape} "
            f"and type {array.dtype}"
        )
    return array.astype(np.int16, copy=False)


@dataclass
class DuplexSession:
    session_id: str
    stats: DuplexStats
    _lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards the inbox, the outbox and the depths: the loop and the clock both use them."""
    _inbox: collections.deque[Pcm] = field(default_factory=lambda: collections.deque())
    _partial: Pcm = field(default_factory=lambda: np.zeros(0, np.int16))
    _outbox: collections.deque[VoiceFrame] = field(default_factory=collections.deque)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set on the loop only (`wake`, `end`)."""
    _depths: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=STANDING_TICKS)
    )
    """The inbox's depth at each of the last ticks, before the tick took its frame."""
    closed: bool = False
    failure: str | None = None
    """Why the model failed under the session (None: it ended normally, or goes on)."""
    frames_out: int = 0
    frames_heard: int = 0

    def feed(self, pcm: Pcm) -> None:
        """Microphone audio (24 kHz PCM16, any length) for the frames to come; ValueError
        for what is not 1-D integer samples. On the loop."""
        samples = as_pcm(pcm)
        with self._lock:
            joined = np.concatenate([self._partial, samples])
            whole = len(joined) // FRAME_SAMPLES * FRAME_SAMPLES
            for start in range(0, whole, FRAME_SAMPLES):
                if len(self._inbox) >= INBOX_FRAMES:
                    self._inbox.popleft()
                    self.stats.dropped_in += 1
                self._inbox.append(joined[start : start + FRAME_SAMPLES])
            self._partial = joined[whole:]

    def next_heard(self) -> Pcm:
        """The frame the model hears this tick (silence when none came in time). On the
        clock."""
        with self._lock:
            self._depths.append(len(self._inbox))
            standing = min(self._depths) if len(self._depths) == STANDING_TICKS else 0
            if standing > 1:
                self._cut_standing_queue(standing - 1)
            if self._inbox:
                self.frames_heard += 1
                return self._inbox.popleft()
        self.stats.unheard_frames += 1
        return np.zeros(FRAME_SAMPLES, np.int16)

    def _cut_standing_queue(self, excess: int) -> None:
        """Drop the `excess` quietest waiting frames (speech is kept before silence)."""
        loudness = [float(np.abs(frame.astype(np.int32)).mean()) for frame in self._inbox]
        quietest = set(sorted(range(len(loudness)), key=loudness.__getitem__)[:excess])
        kept = [frame for k, frame in enumerate(self._inbox) if k not in quietest]
        self._inbox.clear()
        self._inbox.extend(kept)
        self.stats.skipped_in += excess
        self.frames_heard += excess  # passed over: the microphone's stream moved on
        self._depths.clear()

    def deliver(self, pcm: Pcm, text: int, words: str) -> None:
        """The model's frame for this tick, into the outbox (the reader is woken by the
        engine, on the loop). On the clock."""
        with self._lock:
            frame = VoiceFrame(self.frames_out, pcm, text, words, self.frames_heard)
            self.frames_out += 1
            if len(self._outbox) >= OUTBOX_FRAMES:
                self._outbox.popleft()
                self.stats.dropped_out += 1
            self._outbox.append(frame)

    def wake(self) -> None:
        """Frames are waiting. On the loop."""
        self._ready.set()

    def end(self) -> None:
        """No more frames. On the loop."""
        self.closed = True
        self._ready.set()

    def fail(self, reason: str) -> None:
        """The model failed under the session: its reader gets DuplexFailed(reason) after
        the frames it has. On the loop."""
        if not self.closed:
            self.failure = reason
        self.end()

    def _taken(self) -> list[VoiceFrame]:
        with self._lock:
            frames = list(self._outbox)
            self._outbox.clear()
        return frames

    async def frames(self) -> AsyncIterator[VoiceFrame]:
        """The model's voice, frame by frame, until the session closes; DuplexFailed when
        it ended because the model failed under it."""
        while True:
            for frame in self._taken():
                yield frame
            if self.closed:
                for frame in self._taken():
                    yield frame
                if self.failure is not None:
                    raise DuplexFailed(self.failure)
                return
            self._ready.clear()
            await self._ready.wait()
