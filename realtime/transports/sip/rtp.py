"""RTP and RTCP packets for a phone call's audio (RFC 3550), through aiortc's classes.

aiortc's `RtpPacket` and `RtcpSrPacket` already parse and serialise the wire format, so
this module only keeps a sender's state: its SSRC, a sequence number and a timestamp that
advance per packet (both wrapping), and the packet and octet counts an RTCP sender report
carries. `unwrap` extends a 16-bit sequence number so that reordering across a wrap still
compares correctly.
"""

from __future__ import annotations

import secrets
import time

from aiortc.rtp import RtcpSenderInfo, RtcpSrPacket, RtpPacket

__all__ = ["RtpPacket", "RtpSender", "parse", "unwrap"]

NTP_EPOCH_OFFSET = 2_208_988_800
"""Seconds from 1900 (NTP's epoch) to 1970 (Unix's)."""


def parse(data: bytes) -> RtpPacket | None:
    """An RTP packet, or None for anything else (RTCP, junk, a truncated packet)."""
    if len(data) < 12 or data[0] >> 6 != 2 or 72 <= data[1] & 0x7F <= 76:
        return None  # payload types 72-76 are RTCP's packet types (RFC 5761)
    try:
        return RtpPacket.parse(data)
    except ValueError:
        return None


def unwrap(seq: int, reference: int) -> int:
    """`seq` (16 bits) extended to the 32-bit-ish value nearest `reference` (extended)."""
    candidate = (reference & ~0xFFFF) | seq
    if candidate - reference > 0x8000:
        candidate -= 0x10000
    elif reference - candidate > 0x8000:
        candidate += 0x10000
    return candidate


def ntp_now() -> int:
    """The wall clock as a 64-bit NTP timestamp."""
    now = time.time() + NTP_EPOCH_OFFSET
    seconds = int(now)
    return (seconds << 32) | int((now - seconds) * (1 << 32))


class RtpSender:
    """Numbers our outgoing packets: one SSRC, a sequence and a media clock."""

    def __init__(self, payload_type: int, clock_rate: int = 8000) -> None:
        self.ssrc = secrets.randbits(32)
        self.payload_type = payload_type
        self.clock_rate = clock_rate
        self.sequence = secrets.randbits(16)
        self.timestamp = secrets.randbits(32)
        self.packets = 0
        self.octets = 0
        self._marker = True

    def packet(self, payload: bytes, samples: int, payload_type: int | None = None) -> bytes:
        """The next packet carrying `payload` (`samples` long); the marker bit on the first
        packet of a talk spurt (`talkspurt()`)."""
        packet = RtpPacket(
            payload_type=self.payload_type if payload_type is None else payload_type,
            marker=int(self._marker),
            sequence_number=self.sequence,
            timestamp=self.timestamp,
            ssrc=self.ssrc,
            payload=payload,
        )
        self._marker = False
        self.sequence = (self.sequence + 1) & 0xFFFF
        self.timestamp = (self.timestamp + samples) & 0xFFFFFFFF
        self.packets += 1
        self.octets += len(payload)
        return packet.serialize()

    def talkspurt(self) -> None:
        self._marker = True

    def sender_report(self) -> bytes:
        """An RTCP SR for what we have sent so far (no report blocks)."""
        info = RtcpSenderInfo(
            ntp_timestamp=ntp_now(),
            rtp_timestamp=self.timestamp,
            packet_count=self.packets & 0xFFFFFFFF,
            octet_count=self.octets & 0xFFFFFFFF,
        )
        return bytes(RtcpSrPacket(ssrc=self.ssrc, sender_info=info))
