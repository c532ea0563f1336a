"""The caller's audio handed to the session the moment each packet arrives.

aiortc gives every audio receiver a jitter buffer that releases a frame only once four
later frames have arrived (`prefetch=4`): 80 ms of delay on every inbound frame, meant to
smooth playback. The server plays nothing back; it runs voice detection, whose every
decision (a barge-in, the end of a turn) came that late. Without the prefetch aiortc's
buffer still holds each frame until the next packet shows it complete (a packet of
another timestamp): 20 ms more on every decision, which is a video frame's rule (a
picture spans packets). An audio packet is a whole frame (RFC 7587 for Opus, RFC 3551
for G.711), so `AudioJitterBuffer` hands an in-order packet over at once: the barge-in
at 50 WebRTC calls lost those 20 ms (docs/benchmarks/transports.md).

It still puts packets back in order: one that comes ahead of a missing one is held
until the missing one arrives, or for at most `GAP_WAIT_PACKETS` (then the missing one
is taken for lost and what is held goes on). aiortc's receiver takes one frame per
packet added, so frames released together (the gap's run) come as one `HeldFrames`
whose `following` the inline decoder (inline_decode.py) decodes after it: nothing held
is dropped, and the buffer is empty again once the run is out, with no lasting delay.

Like guards.py and inline_decode.py this stands on aiortc's internals: it checks them,
and leaves a receiver it does not recognise (or whose decoder is not the inline one,
which alone knows `HeldFrames`) as it is.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiortc import RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add

from .inline_decode import InlineDecoder

_BUFFER = "_RTCRtpReceiver__jitter_buffer"
_KIND = "_RTCRtpReceiver__kind"
_QUEUE = "_RTCRtpReceiver__decoder_queue"

GAP_WAIT_PACKETS = 3
"""Packets held behind a missing one before it is taken for lost (60 ms of audio): a
packet reordered on its way comes within that, a lost one never does."""
CAPACITY = 16
"""Packets ahead of the next one expected that are still waited for (aiortc's audio
capacity): one further ahead means what is missing is long gone."""
RESTART_BEHIND = 100
"""A packet this far behind the next expected is a sender that started its numbering
again (aiortc's MAX_MISORDER), not a late one."""


class HeldFrames(JitterFrame):
    """The first of several frames released together; `following` are the rest, in order,
    as (payload, RTP timestamp after this frame's)."""

    def __init__(self, first: RtpPacket, rest: list[RtpPacket]) -> None:
        super().__init__(data=_payload(first), timestamp=first.timestamp)
        self.following = [(_payload(p), (p.timestamp - first.timestamp) & 0xFFFFFFFF) for p in rest]


class AudioJitterBuffer:
    """What aiortc's receiver asks of its jitter buffer (`add`), for whole-frame packets."""

    capacity = CAPACITY

    def __init__(self) -> None:
        self._next: int | None = None
        self._held: dict[int, RtpPacket] = {}
        self.lost = 0
        """Packets taken for lost (never arrived within GAP_WAIT_PACKETS)."""

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """Add one packet; the frame (or run of frames) that is ready now, if any. The
        bool is aiortc's "ask for a picture" flag, never set for audio."""
        seq = packet.sequence_number
        if self._next is None:
            self._next = seq
        ahead = uint16_add(seq, -self._next)
        if ahead >= 0x8000:  # behind the next expected
            if 0x10000 - ahead < RESTART_BEHIND:
                return False, None  # late (its place was given up) or a duplicate
            return False, self._restart(packet)
        if ahead >= CAPACITY:
            return False, self._restart(packet)
        self._held[seq] = packet
        return False, self._release()

    def _release(self) -> JitterFrame | None:
        """The frames from the next expected on, while they are here; a missing one is
        waited for until `GAP_WAIT_PACKETS` are held behind it, then passed over."""
        run: list[RtpPacket] = []
        while True:
            start = self._next
            assert start is not None
            if start not in self._held:
                if len(self._held) < GAP_WAIT_PACKETS:
                    break
                first = _in_order(self._held, start)[0]
                self.lost += uint16_add(first, -start)
                self._next = start = first
            while start in self._held:
                run.append(self._held.pop(start))
                start = self._next = uint16_add(start, 1)
        return _frames(run) if run else None

    def _restart(self, packet: RtpPacket) -> JitterFrame:
        """Everything held, in order, then `packet`, from which numbering goes on."""
        assert self._next is not None
        held = [self._held[s] for s in _in_order(self._held, self._next)]
        self._held.clear()
        self._next = uint16_add(packet.sequence_number, 1)
        return _frames([*held, packet])


def _in_order(seqs: Iterable[int], origin: int) -> list[int]:
    """Sequence numbers in the order they follow `origin`, across the 16-bit wrap."""
    return sorted(seqs, key=lambda s: uint16_add(s, -origin))


def _payload(packet: RtpPacket) -> bytes:
    return packet._data  # type: ignore[attr-defined,no-any-return]


def _frames(run: list[RtpPacket]) -> JitterFrame:
    if len(run) == 1:
        return JitterFrame(data=_payload(run[0]), timestamp=run[0].timestamp)
    return HeldFrames(run[0], run[1:])


def release_at_once(receiver: RTCRtpReceiver) -> bool:
    """Give `receiver` an `AudioJitterBuffer`; False (nothing changed) for a video
    receiver, an aiortc whose receiver is not the one we know, or one whose audio is not
    decoded inline."""
    buffer = getattr(receiver, _BUFFER, None)
    if getattr(receiver, _KIND, None) != "audio" or not isinstance(buffer, JitterBuffer):
        return False
    if not isinstance(getattr(receiver, _QUEUE, None), InlineDecoder):
        return False
    setattr(receiver, _BUFFER, AudioJitterBuffer())
    return True
