"""The RTP endpoint on real loopback sockets: reordering, duplicates, losses and a stalled
stream reach the session's side in order, at 8 kHz, one 20 ms frame per packet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from realtime import g711
from realtime.transports.sip.rtp import RtpPacket
from realtime.transports.sip.rtp_session import PACKET_SAMPLES, RtpEndpoint
from realtime.transports.sip.sdp_audio import Negotiated
from sessions import PlayoutBuffer


class Sink(asyncio.DatagramProtocol):
    def datagram_received(self, data: bytes, addr: Any) -> None:
        pass


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[RtpEndpoint, list[int], asyncio.DatagramTransport]]:
    """An endpoint whose audio callback records each frame's level (its packet's number)."""
    loop = asyncio.get_running_loop()
    peer, _ = await loop.create_datagram_endpoint(Sink, local_addr=("127.0.0.1", 0))
    heard: list[int] = []

    async def on_audio(pcm: bytes) -> None:
        frame = np.frombuffer(pcm, dtype=np.int16)
        assert len(frame) == PACKET_SAMPLES
        heard.append(round(float(frame.mean()) / 100))

    media = Negotiated(0, g711.PCMU, 101, peer.get_extra_info("sockname"), "sendrecv")
    rtp = RtpEndpoint(media, PlayoutBuffer(8000, piece_ms=20), on_audio, lambda d: None)
    await rtp.open("127.0.0.1")
    yield rtp, heard, peer
    await rtp.close()
    peer.close()


def packet(seq: int, level: int) -> bytes:
    """Packet `seq` whose audio is a constant `level` x 100 (mu-law keeps it within ~3 %)."""
    pcm = np.full(PACKET_SAMPLES, level * 100, dtype=np.int16)
    return RtpPacket(
        payload_type=0,
        sequence_number=seq,
        timestamp=seq * 160,
        ssrc=7,
        payload=g711.ulaw_encode(pcm),
    ).serialize()


async def send(peer: asyncio.DatagramTransport, rtp: RtpEndpoint, order: list[int]) -> None:
    for seq in order:
        peer.sendto(packet(seq, seq % 50 + 1), ("127.0.0.1", rtp.port))
        await asyncio.sleep(0.002)


async def settle(heard: list[int], count: int) -> None:
    async with asyncio.timeout(2):
        while len(heard) < count:
            await asyncio.sleep(0.005)


async def test_reordered_and_duplicated_packets_come_out_once_in_order(
    endpoint: tuple[RtpEndpoint, list[int], asyncio.DatagramTransport],
) -> None:
    rtp, heard, peer = endpoint
    await send(peer, rtp, [1, 3, 2, 2, 5, 4, 6, 6, 7, 8, 9])
    await settle(heard, 9)
    await asyncio.sleep(0.05)
    assert heard == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert rtp.jitter.duplicates + rtp.jitter.late == 2
    assert rtp.latched and rtp.remote == peer.get_extra_info("sockname")


async def test_a_lost_packet_is_a_silent_frame_and_a_stall_lets_the_rest_through(
    endpoint: tuple[RtpEndpoint, list[int], asyncio.DatagramTransport],
) -> None:
    rtp, heard, peer = endpoint
    await send(peer, rtp, [10, 11, 13])  # 12 never comes; 13 waits for it...
    await asyncio.sleep(0.03)
    assert heard == [11, 12]
    await settle(heard, 4)  # ...until the stream has been quiet for a while
    assert heard == [11, 12, 0, 14]
    assert rtp.jitter.lost == 1


async def test_packets_from_a_stranger_are_ignored_once_latched(
    endpoint: tuple[RtpEndpoint, list[int], asyncio.DatagramTransport],
) -> None:
    rtp, heard, peer = endpoint
    await send(peer, rtp, [1, 2, 3, 4])
    await settle(heard, 4)
    loop = asyncio.get_running_loop()
    stranger, _ = await loop.create_datagram_endpoint(Sink, local_addr=("127.0.0.1", 0))
    try:
        for seq in range(5, 12):
            stranger.sendto(packet(seq, 40), ("127.0.0.1", rtp.port))
        await asyncio.sleep(0.2)
    finally:
        stranger.close()
    assert 40 not in heard
