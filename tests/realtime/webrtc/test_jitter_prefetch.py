"""Without prefetch, a jitter buffer hands a frame over with the next packet, not four
packets later, and still puts packets back in order. (That a call's receiver runs without
prefetch is checked in test_inline_decode.py, on the same call.)"""

from __future__ import annotations

from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket


def packet(seq: int) -> RtpPacket:
    """A 20 ms Opus packet as the receiver hands it to the buffer (depayloaded: `_data`)."""
    rtp = RtpPacket(payload_type=111, sequence_number=seq, timestamp=960 * seq, payload=b"x")
    rtp._data = b"x"  # type: ignore[attr-defined]
    return rtp


def released(buffer: JitterBuffer, seqs: list[int]) -> list[int | None]:
    """For each packet added in turn: the sequence number of the frame that came out."""
    out: list[int | None] = []
    for seq in seqs:
        _, frame = buffer.add(packet(seq))
        out.append(None if frame is None else frame.timestamp // 960)
    return out


def test_without_prefetch_a_frame_comes_out_with_the_next_packet() -> None:
    assert released(JitterBuffer(capacity=16, prefetch=4), [1, 2, 3, 4, 5, 6]) == [
        *[None] * 4,
        1,
        2,
    ]
    assert released(JitterBuffer(capacity=16, prefetch=0), [1, 2, 3, 4]) == [None, 1, 2, 3]


def test_without_prefetch_reordered_packets_still_come_out_in_order() -> None:
    buffer = JitterBuffer(capacity=16, prefetch=0)
    assert released(buffer, [1, 3, 2, 4]) == [None, None, 1, 2]
    assert released(buffer, [5]) == [3]
