"""A small jitter buffer for a phone call's inbound RTP: reorder, drop duplicates, skip losses.

Packets of a 20 ms stream arrive out of order now and then; the buffer holds them by
(extended) sequence number and releases them in order. A gap waits for its packet while
fewer than `depth` packets (3: ~60 ms) are held behind it; then the packet counts as lost
and `None` (a frame of silence to the caller) takes its place, so the session's timeline
keeps its length. Packets older than what was already released, and duplicates, are
dropped. The buffer is driven by arrivals only; `flush()` releases what it holds (the call
ending, or the stream going quiet).
"""

from __future__ import annotations

from .rtp import unwrap

MAX_GAP = 50
"""A jump of more sequence numbers than this (a restarted sender) resets the buffer
instead of filling a second of silence."""


class JitterBuffer:
    def __init__(self, depth: int = 3) -> None:
        self.depth = depth
        self._held: dict[int, bytes] = {}
        self._next: int | None = None
        self._last: int | None = None
        self.lost = 0
        self.duplicates = 0
        self.late = 0
        self.reordered = 0

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def push(self, sequence: int, payload: bytes) -> list[bytes | None]:
        """Add a packet; returns the payloads now due, in order (None for a lost one)."""
        if self._next is None or self._last is None:
            self._next = self._last = sequence
        seq = unwrap(sequence, self._last)
        if seq < self._next:
            self.late += 1
            return []
        if seq in self._held:
            self.duplicates += 1
            return []
        if seq - self._next > MAX_GAP:
            out = self.flush()
            self._next = seq
        else:
            out = []
        if seq < self._last:
            self.reordered += 1
        self._last = max(self._last, seq)
        self._held[seq] = payload
        out.extend(self._release())
        return out

    def _release(self) -> list[bytes | None]:
        assert self._next is not None
        out: list[bytes | None] = []
        while self._held:
            if self._next in self._held:
                out.append(self._held.pop(self._next))
            elif len(self._held) >= self.depth:
                out.append(None)
                self.lost += 1
            else:
                break
            self._next += 1
        return out

    def flush(self) -> list[bytes | None]:
        """Everything held, in order, gaps as None."""
        out: list[bytes | None] = []
        if self._next is None:
            return out
        while self._held:
            payload = self._held.pop(self._next, None)
            if payload is None:
                self.lost += 1
            out.append(payload)
            self._next += 1
        return out
