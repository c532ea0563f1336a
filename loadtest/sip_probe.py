"""A measuring phone for the SIP benchmark: a minimal UDP user agent client and RTP peer.

sipp places most of the benchmark's calls, but it cannot say when each RTP packet arrived,
and Parley keeps its pacing counters inside the server. So a few calls are made by this
probe: a bare INVITE / ACK / BYE over UDP (enough for a loopback UAS that answers at once),
then mu-law speech out at a microphone's 20 ms pace and every packet back timestamped on
arrival. An inter-arrival gap over `LATE_GAP_S` counts as a late packet; the server sends a
packet every 20 ms (silence when nothing plays), so the gaps are its pacing as heard.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from realtime import g711
from realtime.transports.sip import message as sip
from realtime.transports.sip.rtp import RtpSender, parse
from realtime.transports.sip.sdp_audio import parse_offer

PACKET = 160
LATE_GAP_S = 0.030
LOUD_RMS = 500.0
"""A received packet above this RMS is audible answer audio, not silence."""
T1 = 0.5

Address = tuple[str, int]


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, on_data: Any) -> None:
        self.on_data = on_data

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.on_data(data)


@dataclass
class Probe:
    """One call: SIP on `sip_port`'s server, RTP both ways, arrivals recorded."""

    server: Address
    arrivals: list[float] = field(default_factory=list)
    loud: list[bool] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)
    answered: bool = False

    def __post_init__(self) -> None:
        self._call_id = f"{uuid.uuid4().hex}@probe"
        self._tag = uuid.uuid4().hex[:10]
        self._responses: asyncio.Queue[sip.Message] = asyncio.Queue()
        self._to = ""
        self._sip: asyncio.DatagramTransport | None = None
        self._rtp: asyncio.DatagramTransport | None = None
        self._target: Address = ("127.0.0.1", 0)
        self._sender = RtpSender(payload_type=0)
        self._heard = asyncio.Event()

    async def dial(self) -> None:
        loop = asyncio.get_running_loop()
        self._sip, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self._on_sip), local_addr=("127.0.0.1", 0)
        )
        self._rtp, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self._on_rtp), local_addr=("127.0.0.1", 0)
        )
        rtp_port = self._rtp.get_extra_info("sockname")[1]
        sdp = (
            "v=0\r\no=probe 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {rtp_port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
        )
        ok = await self._transact("INVITE", 1, sdp.encode())
        if ok.status != 200:
            raise RuntimeError(f"INVITE answered {ok.status} {ok.reason}")
        self._to = ok.header("To")
        answer = parse_offer(ok.body.decode())
        self._target = (answer.address, answer.port)
        self._send("ACK", 1, b"")
        self.answered = True

    async def hang_up(self) -> None:
        try:
            if self.answered:
                await self._transact("BYE", 2, b"")
        finally:
            for transport in (self._sip, self._rtp):
                if transport is not None:
                    transport.close()

    async def say(self, pcm: np.ndarray) -> float:
        """`pcm` (8 kHz int16) as 20 ms packets at real-time pace; when its first went out."""
        assert self._rtp is not None
        start = time.monotonic()
        for n, offset in enumerate(range(0, len(pcm), PACKET)):
            frame = np.zeros(PACKET, np.int16)
            chunk = pcm[offset : offset + PACKET]
            frame[: len(chunk)] = chunk
            self._rtp.sendto(self._sender.packet(g711.ulaw_encode(frame), PACKET), self._target)
            await asyncio.sleep(max(0.0, start + (n + 1) * 0.02 - time.monotonic()))
        return start

    def gaps(self, since: float = 0.0) -> list[float]:
        """Seconds between consecutive arrivals after `since`."""
        times = [t for t in self.arrivals if t >= since]
        return [b - a for a, b in itertools.pairwise(times)]

    def late_gaps(self, since: float = 0.0) -> tuple[int, int]:
        """(gaps over LATE_GAP_S, packets received) for arrivals after `since`."""
        gaps = self.gaps(since)
        return sum(1 for gap in gaps if gap > LATE_GAP_S), len(gaps) + bool(gaps)

    def loud_times(self, since: float = 0.0, until: float = float("inf")) -> list[float]:
        return [
            t
            for t, loud in zip(self.arrivals, self.loud, strict=True)
            if loud and since <= t < until
        ]

    async def hear(self, packets: int, since: float) -> None:
        """Wait until `packets` audible packets have arrived after `since`."""
        while len(self.loud_times(since=since)) < packets:
            self._heard.clear()
            await self._heard.wait()

    def _on_rtp(self, data: bytes) -> None:
        packet = parse(data)
        if packet is None or packet.payload_type != 0:
            return
        pcm = g711.ulaw_decode(packet.payload).astype(np.float64)
        self.arrivals.append(time.monotonic())
        self.loud.append(bool(len(pcm)) and float(np.sqrt(np.mean(pcm**2))) > LOUD_RMS)
        self.sequences.append(packet.sequence_number)
        if self.loud[-1]:
            self._heard.set()

    def _on_sip(self, data: bytes) -> None:
        try:
            msg = sip.parse(data)
        except sip.MalformedMessage:
            return
        if not msg.is_request:
            self._responses.put_nowait(msg)
        elif msg.method == "BYE":  # the server ended the call
            self.answered = False

    def _send(self, method: str, cseq: int, body: bytes) -> None:
        assert self._sip is not None
        host, port = self._sip.get_extra_info("sockname")[:2]
        branch = f"z9hG4bK{uuid.uuid4().hex[:12]}"
        to = self._to or f"<sip:parley@{self.server[0]}:{self.server[1]}>"
        headers = [
            ("Via", f"SIP/2.0/UDP {host}:{port};branch={branch};rport"),
            ("From", f"<sip:probe@{host}:{port}>;tag={self._tag}"),
            ("To", to),
            ("Call-ID", self._call_id),
            ("CSeq", f"{cseq} {method}"),
            ("Max-Forwards", "70"),
            ("Contact", f"<sip:probe@{host}:{port}>"),
        ]
        if body:
            headers.append(("Content-Type", "application/sdp"))
        uri = f"sip:parley@{self.server[0]}:{self.server[1]}"
        self._sip.sendto(
            sip.Message(method=method, uri=uri, headers=headers, body=body).serialise(), self.server
        )

    async def _transact(self, method: str, cseq: int, body: bytes) -> sip.Message:
        """Send until a final response to this CSeq arrives (T1 doubling, 10 s in all)."""
        async with asyncio.timeout(10):
            for attempt in itertools.count():
                self._send(method, cseq, body)
                wait = T1 * 2**attempt
                provisional = False
                try:
                    async with asyncio.timeout(wait):
                        while True:
                            msg = await self._responses.get()
                            if msg.cseq != (cseq, method):
                                continue
                            if msg.status >= 200:
                                return msg
                            provisional = True
                except TimeoutError:
                    if provisional:  # the server has it: wait for the final without resending
                        while True:
                            msg = await self._responses.get()
                            if msg.cseq == (cseq, method) and msg.status >= 200:
                                return msg
        raise AssertionError("unreachable")
