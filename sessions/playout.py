"""The one playout engine: a bounded, clearable audio queue with a playback cursor.

Every transport plays a session's answer through a `PlayoutBuffer`, whatever drives it:
a media clock (a WebRTC track, the tests' clocked sink) pulls `next_frame()` every 20 ms
and gets silence when nothing is queued or playback is paused; a paced sender (the
WebSocket transports, which have no media clock) `take()`s one piece at a time, unpadded,
at the pace it keeps. Either way the same rules hold:

- `write()` waits while `max_ms` or more is queued: backpressure that paces generation to
  playback without an unbounded queue.
- `clear()` drops everything queued at once, and the rest of any write it interrupted: a
  write still waiting for room when the answer was cut off queues nothing more.
- `pause()` holds playback and keeps the queue (the user started talking over the answer,
  not yet long enough to count as an interruption: a cough costs a pause, not the answer);
  `resume()` goes on.
- `played_ms` is the playback cursor: milliseconds handed to the transport since the
  buffer was created (a frame padded with silence counts whole: it plays whole).
- `drained()` returns once everything written has been played (or cleared).
- After `close()` writes are dropped, and a waiting one returns.

Audio is cut into pieces as it is queued (20 ms frames unless the transport asks for
longer), so a clear or a pause takes effect at the next piece; a short last piece is
topped up by the next write, unless `seal()` said that something (an event) now follows it.

A buffer with a fixed `sample_rate` converts audio at another rate through one resampler
stream per response, so chunk boundaries leave no trace. The stream holds back its filter's
look-ahead: that tail is queued when the response ends (`drained()`), or at once when
playback runs dry mid-answer (play what we have, as for a partial frame); `clear()` drops it,
so a barge-in's next answer starts a clean stream. `set_rate()` changes the rate it plays at
(a client that asked for another output format): what is queued stays as it is.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.audio_format import FRAME_MS, OUTPUT_SAMPLE_RATE, frame_samples

from .resample import OutputResampler

__all__ = ["FRAME_MS", "Piece", "PlayoutBuffer", "PlayoutSink"]


@dataclass(slots=True)
class Piece:
    """Queued audio: PCM16 mono at `rate`, at most one piece long."""

    pcm: npt.NDArray[np.int16]
    rate: int

    @property
    def ms(self) -> float:
        return len(self.pcm) * 1000 / self.rate


class PlayoutBuffer:
    """The playout engine (see the module docstring for its rules).

    `sample_rate`: the rate it plays at, other rates resampled; None plays each write at its
    own rate (a transport that tells its client the rate of each piece). `admit` is asked
    before each new piece is queued and may refuse it (a sender whose queue also holds
    events bounds both together); `on_change` is told whenever the queue or the pause
    state changes (a sender task waiting for work).
    """

    def __init__(
        self,
        sample_rate: int | None = OUTPUT_SAMPLE_RATE,
        max_ms: int = 2_000,
        *,
        piece_ms: int = FRAME_MS,
        admit: Callable[[], bool] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.sample_rate = sample_rate
        self.max_ms = max_ms
        self.piece_ms = piece_ms
        self.frame_samples = frame_samples(sample_rate, piece_ms) if sample_rate else 0
        """Samples in one `next_frame()` (a fixed-rate buffer only)."""
        self.silence = np.zeros(self.frame_samples, dtype=np.int16)
        """What `next_frame()` returns when nothing plays (compare with `is`)."""
        self._admit = admit
        self._on_change = on_change
        self._pieces: collections.deque[Piece] = collections.deque()
        self._sealed = False
        self._queued_ms = 0.0
        self._played_ms = 0.0
        self._resampler: OutputResampler | None = None
        self._writers = 0
        self._generation = 0
        """Bumped by clear(): a write waiting for room drops the rest of its audio."""
        self._room = asyncio.Event()
        self._room.set()
        self._empty = asyncio.Event()
        self._empty.set()
        self.paused = False
        self.closed = False
        self.pieces_added = 0
        self.pieces_removed = 0
        """Pieces ever queued and ever gone (played, dropped or cleared): piece n (from 1)
        is still queued while `pieces_removed < n`. A sender orders its events by these."""

    # --- state -----------------------------------------------------------------------------

    @property
    def played_ms(self) -> int:
        return int(self._played_ms)

    @property
    def queued_ms(self) -> int:
        return int(self._queued_ms)

    @property
    def queued_pieces(self) -> int:
        return len(self._pieces)

    # --- writing ---------------------------------------------------------------------------

    async def write(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        """Queue `pcm`, waiting while `max_ms` is queued. Dropped after `close()`; the rest
        of it dropped if `clear()` comes while it waits."""
        if self.closed:
            return
        generation = self._generation
        data, rate = self._convert(pcm.astype(np.int16, copy=False).reshape(-1), sample_rate)
        self._writers += 1
        try:
            start = 0
            while start < len(data):
                while self._queued_ms >= self.max_ms and not self.closed:
                    self._room.clear()
                    await self._room.wait()
                if self.closed or generation != self._generation:
                    return
                start += self._add(data[start:], rate)
        finally:
            self._writers -= 1

    def set_rate(self, sample_rate: int) -> None:
        """Play at `sample_rate` from the next write on (a fixed-rate buffer). The current
        stream's tail is queued first, at the old rate, unless a write is under way (then
        it is dropped: a few ms at a format change)."""
        if self.sample_rate is None or sample_rate == self.sample_rate:
            return
        self._queue_tail()
        if self._resampler is not None:
            self._resampler.discard()
        self._resampler = None
        self.sample_rate = sample_rate
        self.frame_samples = frame_samples(sample_rate, self.piece_ms)
        self.silence = np.zeros(self.frame_samples, dtype=np.int16)

    def seal(self) -> None:
        """The last queued piece is complete: the next write starts a new one."""
        if self._pieces:
            self._sealed = True

    def _convert(self, pcm: npt.NDArray[np.int16], rate: int) -> tuple[npt.NDArray[np.int16], int]:
        """`pcm` at the buffer's rate, through the response's resampler stream (the tail
        of a stream from another rate first)."""
        target = self.sample_rate or rate
        tail = np.zeros(0, dtype=np.int16)
        resampler = self._resampler
        if resampler is not None and resampler.from_rate != rate:
            tail = resampler.flush()
            resampler = self._resampler = None
        if rate == target:
            return (np.concatenate([tail, pcm]) if len(tail) else pcm), target
        if resampler is None:
            resampler = self._resampler = OutputResampler(rate, target)
        return np.concatenate([tail, resampler.push(pcm)]), target

    def _add(self, data: npt.NDArray[np.int16], rate: int) -> int:
        """Queue the start of `data`: top up the last piece or add one. Returns the samples
        used (a piece `admit` refused is used up too: it is dropped)."""
        piece_samples = max(1, frame_samples(rate, self.piece_ms))
        last = self._pieces[-1] if self._pieces and not self._sealed else None
        if last is not None and last.rate == rate and self._short(last):
            take = min(piece_samples - len(last.pcm), len(data))
            last.pcm = np.concatenate([last.pcm, data[:take]])
        else:
            take = min(piece_samples, len(data))
            if self._admit is not None and not self._admit():
                return take
            self._pieces.append(Piece(data[:take].copy(), rate))
            self._sealed = False
            self.pieces_added += 1
        self._queued_ms += take * 1000 / rate
        self._empty.clear()
        self._changed()
        return take

    def _queue_tail(self) -> None:
        """Queue what the resampler holds back (the end of the response, or playback ran
        dry): at once, past `max_ms` if need be (it is a few tens of ms)."""
        if self._resampler is None or self._writers:
            return  # a write in progress comes first; its tail after it
        tail = self._resampler.flush()
        start = 0
        while start < len(tail):
            start += self._add(tail[start:], self._resampler.to_rate)

    # --- playing ---------------------------------------------------------------------------

    def next_frame(self) -> npt.NDArray[np.int16]:
        """The next frame to play (fixed-rate buffers): queued audio, padded with silence
        if short, or `silence` when idle or paused."""
        if self.paused:
            return self.silence
        piece = self._pop()
        if piece is None:
            return self.silence
        self._played_ms += self.piece_ms
        if len(piece.pcm) == self.frame_samples:
            return piece.pcm
        frame = np.zeros(self.frame_samples, dtype=np.int16)
        frame[: len(piece.pcm)] = piece.pcm  # generation paused mid-frame: play what we have
        return frame

    def take(self) -> Piece | None:
        """The next piece to play as it is, or None when idle or paused."""
        if self.paused:
            return None
        piece = self._pop()
        if piece is not None:
            self._played_ms += piece.ms
        return piece

    def _pop(self) -> Piece | None:
        if not self._pieces or (len(self._pieces) == 1 and self._short(self._pieces[0])):
            self._queue_tail()  # running dry: play what the resampler holds too
        if not self._pieces:
            self._empty.set()
            return None
        piece = self._remove_head()
        self._changed()
        return piece

    def _short(self, piece: Piece) -> bool:
        return len(piece.pcm) < frame_samples(piece.rate, self.piece_ms)

    def _remove_head(self) -> Piece:
        piece = self._pieces.popleft()
        self.pieces_removed += 1
        self._queued_ms = max(0.0, self._queued_ms - piece.ms) if self._pieces else 0.0
        if self._queued_ms < self.max_ms:
            self._room.set()
        if not self._pieces:
            self._sealed = False
            self._empty.set()
        return piece

    # --- control ---------------------------------------------------------------------------

    def pause(self) -> None:
        """Hold playback (the user may be interrupting): silence, nothing consumed."""
        self.paused = True
        self._changed()

    def resume(self) -> None:
        self.paused = False
        self._changed()

    def clear(self) -> None:
        """Drop all queued audio, what the resampler holds and the rest of a waiting write."""
        self.pieces_removed += len(self._pieces)
        self._pieces.clear()
        self._sealed = False
        self._queued_ms = 0.0
        self._generation += 1
        if self._resampler is not None:
            self._resampler.discard()
        self._empty.set()
        self._room.set()
        self._changed()

    def drop_oldest(self) -> bool:
        """Drop the oldest queued piece unplayed (a bounded queue making room); False if
        there is none."""
        if not self._pieces:
            return False
        self._remove_head()
        self._changed()
        return True

    def close(self) -> None:
        """Take no more audio; a waiting write returns. Idempotent."""
        self.closed = True
        self._room.set()
        self._changed()

    async def drained(self) -> None:
        """Return once everything written has been played (or cleared). Called at the end
        of a response, so it first queues the resampler's tail."""
        self._queue_tail()
        await self._empty.wait()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


class PlayoutSink:
    """The audio half of an OutputSink: everything goes through one PlayoutBuffer, which
    the transport plays out. Subclasses add `event()` and may extend `clear`/`pause`
    (calling these)."""

    def __init__(self, playout: PlayoutBuffer) -> None:
        self.playout = playout

    async def audio(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        await self.playout.write(pcm, sample_rate)

    def clear(self) -> None:
        self.playout.clear()

    def pause(self) -> None:
        self.playout.pause()

    def resume(self) -> None:
        self.playout.resume()

    @property
    def played_ms(self) -> int:
        return self.playout.played_ms

    async def drained(self) -> None:
        await self.playout.drained()
