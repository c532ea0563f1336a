"""RTP packets, the jitter buffer and RFC 4733 digits, without sockets."""

from __future__ import annotations

import struct

from aiortc.rtp import RtcpPacket

from realtime.transports.sip.dtmf import DtmfReceiver, event_payload, parse_event
from realtime.transports.sip.jitter import JitterBuffer
from realtime.transports.sip.rtp import RtpSender, parse, unwrap


def test_sender_numbers_packets_and_they_parse_back() -> None:
    sender = RtpSender(payload_type=8)
    first = parse(sender.packet(b"\xd5" * 160, 160))
    second = parse(sender.packet(b"\xd5" * 160, 160))
    assert first is not None and second is not None
    assert (first.payload_type, first.marker, len(first.payload)) == (8, 1, 160)
    assert second.marker == 0
    assert second.sequence_number == (first.sequence_number + 1) & 0xFFFF
    assert second.timestamp == (first.timestamp + 160) & 0xFFFFFFFF
    assert first.ssrc == second.ssrc == sender.ssrc
    sender.talkspurt()
    third = parse(sender.packet(b"", 160))
    assert third is not None and third.marker == 1


def test_sender_report_is_rfc3550_sr() -> None:
    sender = RtpSender(payload_type=0)
    for _ in range(3):
        sender.packet(bytes(160), 160)
    (report,) = RtcpPacket.parse(sender.sender_report())
    assert report.ssrc == sender.ssrc  # type: ignore[union-attr]
    info = report.sender_info  # type: ignore[union-attr]
    assert (info.packet_count, info.octet_count) == (3, 480)
    assert info.rtp_timestamp == sender.timestamp
    assert info.ntp_timestamp >> 32 > 3_900_000_000  # seconds since 1900: after 2023


def test_junk_and_rtcp_are_not_rtp() -> None:
    sender = RtpSender(payload_type=0)
    assert parse(b"") is None
    assert parse(b"\x00" * 20) is None  # version 0
    assert parse(sender.sender_report()) is None  # RTCP SR: payload type byte 200
    assert parse(sender.packet(b"x", 1)[:11]) is None


def test_unwrap_across_the_wrap() -> None:
    assert unwrap(2, 65534) == 65538
    assert unwrap(65534, 65538) == 65534
    assert unwrap(10, 5) == 10


def run(buffer: JitterBuffer, order: list[int]) -> list[int | None]:
    out: list[int | None] = []
    for seq in order:
        for payload in buffer.push(seq & 0xFFFF, struct.pack("!I", seq)):
            out.append(None if payload is None else struct.unpack("!I", payload)[0])
    for payload in buffer.flush():
        out.append(None if payload is None else struct.unpack("!I", payload)[0])
    return out


def test_jitter_in_order() -> None:
    assert run(JitterBuffer(), [1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5]


def test_jitter_reordered_within_depth() -> None:
    buffer = JitterBuffer()
    assert run(buffer, [1, 3, 2, 5, 4, 6]) == [1, 2, 3, 4, 5, 6]
    assert buffer.reordered == 2 and buffer.lost == 0


def test_jitter_loss_becomes_a_gap_after_60_ms() -> None:
    buffer = JitterBuffer(depth=3)
    out: list[bytes | None] = []
    out += buffer.push(10, b"a")
    out += buffer.push(12, b"c")
    out += buffer.push(13, b"d")
    assert out == [b"a"]  # 11 may still come
    out += buffer.push(14, b"e")
    assert out == [b"a", None, b"c", b"d", b"e"]
    assert buffer.lost == 1
    assert buffer.push(11, b"b") == []  # too late now
    assert buffer.late == 1


def test_jitter_drops_duplicates() -> None:
    buffer = JitterBuffer()
    assert run(buffer, [1, 2, 2, 4, 4, 3, 3, 5]) == [1, 2, 3, 4, 5]
    assert buffer.duplicates + buffer.late == 3


def test_jitter_across_the_sequence_wrap() -> None:
    assert run(JitterBuffer(), [65534, 65536, 65535, 65537]) == [65534, 65535, 65536, 65537]


def test_jitter_resets_on_a_jump() -> None:
    assert run(JitterBuffer(), [1, 2, 1000, 1001]) == [1, 2, 1000, 1001]


def test_dtmf_once_per_event_on_the_end_bit() -> None:
    receiver = DtmfReceiver()
    digits: list[str] = []
    # '5' pressed at timestamp 1000: start, continuation, three end packets
    for end, duration in [(False, 160), (False, 320), (True, 480), (True, 480), (True, 480)]:
        digit = receiver.receive(1000, event_payload(5, end, duration))
        digits += [digit] if digit else []
    assert digits == ["5"]
    # '#' then '5' again: new events (new timestamps) count again
    assert receiver.receive(2000, event_payload(11, True, 800)) == "#"
    assert receiver.receive(3000, event_payload(5, False, 160)) is None
    assert receiver.receive(3000, event_payload(5, True, 800)) == "5"
    assert receiver.receive(3000, event_payload(5, True, 800)) is None  # retransmitted end
    assert receiver.digits == 3


def test_dtmf_junk() -> None:
    receiver = DtmfReceiver()
    assert receiver.receive(1, b"\x05") is None
    assert receiver.receive(2, event_payload(40, True, 160)) is None  # not a keypad event
    assert parse_event(event_payload(10, True, 400)) == (10, True, 400)
