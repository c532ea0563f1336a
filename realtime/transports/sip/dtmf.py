"""RFC 4733 telephone-events: keypad digits out of RTP, each reported once.

A phone sends a key press as a run of packets that share one RTP timestamp (the event's
start) while the duration grows; the last ones carry the end bit and are sent three
times for safety, and a long press may be refreshed. The digit is reported at its first
end packet; retransmitted end packets (the same timestamp, or the same event restarted
within the call's recent history) are ignored.
"""

from __future__ import annotations

import collections
import struct

EVENTS = "0123456789*#ABCD"
"""Events 0-15: the keypad (10 is *, 11 is #, 12-15 are A-D)."""
REMEMBERED = 16
"""Ended events remembered by timestamp: far more than can overlap."""


def parse_event(payload: bytes) -> tuple[int, bool, int] | None:
    """(event, end bit, duration) of a telephone-event payload, or None if malformed."""
    if len(payload) < 4:
        return None
    event, flags, duration = struct.unpack("!BBH", payload[:4])
    return event, bool(flags & 0x80), duration


def event_payload(event: int, end: bool, duration: int, volume: int = 10) -> bytes:
    """A telephone-event payload (tests and outbound tones)."""
    return struct.pack("!BBH", event, (0x80 if end else 0) | (volume & 0x3F), duration)


class DtmfReceiver:
    def __init__(self) -> None:
        self._ended: collections.deque[int] = collections.deque(maxlen=REMEMBERED)
        self.digits = 0

    def receive(self, timestamp: int, payload: bytes) -> str | None:
        """The digit this packet completes, or None (not the end yet, a repeat, junk)."""
        parsed = parse_event(payload)
        if parsed is None:
            return None
        event, end, _duration = parsed
        if not end or timestamp in self._ended or event >= len(EVENTS):
            return None
        self._ended.append(timestamp)
        self.digits += 1
        return EVENTS[event]
