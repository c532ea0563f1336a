"""A phone call's RTP endpoint: G.711 in and out over UDP, paced, with RTCP and DTMF.

Inbound, each RTP packet goes through the jitter buffer (reorder, duplicates, losses as
silence) and is decoded to 8 kHz PCM16 for `on_audio`; telephone-events become digits for
`on_digit`. Audio waits in a small queue for one reader task, so the datagram callback
never blocks and a slow session drops old audio rather than growing a backlog. When the
caller goes quiet for `STALL_S`, what the jitter buffer still holds is let through.

Outbound, one sender task pulls the next 20 ms frame of the call's playout buffer at fixed
times on the monotonic clock (packet n is due at start + n x 20 ms, so the pace does not
drift) and sends it G.711-encoded, silence when nothing plays, so a clear takes effect at
the next packet. A packet sent over `LATE_MS` after its time counts as late; one that
falls more than `SKIP_MS` behind skips ahead rather than bursting.

Symmetric RTP: packets go to the address the SDP gave until the caller's own packets
arrive, then to where those come from (a caller behind NAT). An RTCP sender report goes
to the RTCP port next to it every `rtcp_interval_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.tasks import TaskSet
from sessions import PlayoutBuffer

from ... import g711
from .dtmf import DtmfReceiver
from .jitter import JitterBuffer
from .rtp import RtpSender, parse
from .sdp_audio import Negotiated

log = logging.getLogger("parley.realtime.sip")

RATE = 8000
PACKET_MS = 20
PACKET_SAMPLES = RATE * PACKET_MS // 1000
LATE_MS = 10.0
SKIP_MS = 200.0
INBOUND_PACKETS = 50
"""Decoded packets waiting for the session (1 s); older ones are dropped beyond that."""
BIND_ATTEMPTS = 20
STALL_S = 0.1
"""No packet for this long: what the jitter buffer holds goes to the session anyway."""

Address = tuple[str, int]


class _Socket(asyncio.DatagramProtocol):
    def __init__(self, on_packet: Callable[[bytes, Address], None]) -> None:
        self.on_packet = on_packet

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.on_packet(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        log.debug("rtp socket error: %s", exc)  # ICMP port unreachable: the caller is gone


class RtpEndpoint:
    def __init__(
        self,
        media: Negotiated,
        playout: PlayoutBuffer,
        on_audio: Callable[[bytes], Awaitable[None]],
        on_digit: Callable[[str], None],
        rtcp_interval_s: float = 5.0,
        on_playing: Callable[[bool], None] | None = None,
    ) -> None:
        """`on_playing(True/False)`: the answer's audio started or stopped going out."""
        if playout.sample_rate != RATE or playout.piece_ms != PACKET_MS:
            raise ValueError("an RTP endpoint plays an 8 kHz playout buffer of 20 ms frames")
        self.media = media
        self.playout = playout
        self._on_audio = on_audio
        self._on_digit = on_digit
        self._on_playing = on_playing
        self.rtcp_interval_s = rtcp_interval_s
        self.sender = RtpSender(media.payload_type, RATE)
        self.jitter = JitterBuffer()
        self.dtmf = DtmfReceiver()
        self.remote: Address = media.remote
        self.latched = False
        self.host = ""
        self.port = 0
        self.packets_in = 0
        self.packets_sent = 0
        self.late_packets = 0
        self.skipped_packets = 0
        self.dropped_inbound = 0
        self.rtcp_in = 0
        self.audible_packets = 0
        self.last_audible_at: float | None = None
        self._last_in = 0.0
        self._inbound: asyncio.Queue[bytes] = asyncio.Queue(INBOUND_PACKETS)
        self._rtp: asyncio.DatagramTransport | None = None
        self._rtcp: asyncio.DatagramTransport | None = None
        self._tasks = TaskSet("rtp")
        """Owns the send, read and RTCP loops; `close()` closes it."""

    async def open(self, host: str) -> None:
        """Bind an even RTP port on `host` and RTCP on the next one, and start sending."""
        loop = asyncio.get_running_loop()
        for _ in range(BIND_ATTEMPTS):
            rtp, _ = await loop.create_datagram_endpoint(
                lambda: _Socket(self._on_rtp), local_addr=(host, 0)
            )
            port = rtp.get_extra_info("sockname")[1]
            if port % 2 == 0 and port < 65535:
                try:
                    rtcp, _ = await loop.create_datagram_endpoint(
                        lambda: _Socket(self._on_rtcp), local_addr=(host, port + 1)
                    )
                except OSError:
                    pass
                else:
                    self._rtp, self._rtcp, self.host, self.port = rtp, rtcp, host, port
                    break
            rtp.close()
        else:
            raise OSError(f"no free RTP/RTCP port pair on {host}")
        for coro, name in (
            (self._send_loop(), "rtp-out"),
            (self._read_loop(), "rtp-in"),
            (self._rtcp_loop(), "rtcp"),
        ):
            self._tasks.create_task(coro, name=f"rtp:{self.port}:{name}")

    def update(self, media: Negotiated) -> None:
        """A re-INVITE: a new direction, perhaps a new address (re-latched from it)."""
        if media.remote != self.media.remote:
            self.remote, self.latched = media.remote, False
        self.media = media

    async def close(self) -> None:
        """Stop the tasks and close the sockets. Idempotent."""
        await self._tasks.close()
        for transport in (self._rtp, self._rtcp):
            if transport is not None:
                transport.close()
        self._rtp = self._rtcp = None

    # --- inbound -------------------------------------------------------------------------

    def _on_rtp(self, data: bytes, source: Address) -> None:
        packet = parse(data)
        if packet is None:
            return
        if not self.latched:
            self.remote, self.latched = source, True
        elif source != self.remote:
            return  # not the caller's stream
        self.packets_in += 1
        self._last_in = time.monotonic()
        if packet.payload_type == self.media.telephone_event:
            digit = self.dtmf.receive(packet.timestamp, packet.payload)
            if digit is not None:
                self._on_digit(digit)
        elif packet.payload_type == self.media.payload_type:
            for payload in self.jitter.push(packet.sequence_number, packet.payload):
                self._queue(payload)

    def _queue(self, payload: bytes | None) -> None:
        if self._inbound.full():
            self._inbound.get_nowait()
            self.dropped_inbound += 1
        if payload is None or self.media.direction != "sendrecv":
            # lost; or on hold, where the caller's music is not for the assistant, but the
            # session hears that the line is still up (silence keeps it from idling out)
            self._inbound.put_nowait(bytes(PACKET_SAMPLES * 2))
        else:
            self._inbound.put_nowait(g711.decode(payload, self.media.format).tobytes())

    async def _read_loop(self) -> None:
        while True:
            await self._on_audio(await self._inbound.get())

    def _on_rtcp(self, data: bytes, source: Address) -> None:
        self.rtcp_in += 1

    # --- outbound ------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        start = time.monotonic()
        sent = 0
        speaking = False
        while True:
            due = start + sent * PACKET_MS / 1000
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            behind_ms = (time.monotonic() - due) * 1000
            if behind_ms > SKIP_MS:
                skip = int(behind_ms // PACKET_MS)
                self.skipped_packets += skip
                sent += skip
                continue
            if behind_ms > LATE_MS:
                self.late_packets += 1
            sent += 1
            if self.jitter.holding and time.monotonic() - self._last_in > STALL_S:
                for payload in self.jitter.flush():  # the caller went quiet: play what is held
                    self._queue(payload)
            if not self.media.we_send or self._rtp is None:
                continue  # on hold: the answer waits (backpressure) instead of playing out
            pcm = self.playout.next_frame()
            audible = pcm is not self.playout.silence
            if audible != speaking:
                speaking = audible
                if audible:
                    self.sender.talkspurt()
                if self._on_playing is not None:
                    self._on_playing(audible)
            if audible:
                self.audible_packets += 1
                self.last_audible_at = time.monotonic()
            payload = g711.encode(pcm, self.media.format)
            self._rtp.sendto(self.sender.packet(payload, PACKET_SAMPLES), self.remote)
            self.packets_sent += 1

    async def _rtcp_loop(self) -> None:
        while True:
            await asyncio.sleep(self.rtcp_interval_s)
            if self._rtcp is not None and self.sender.packets:
                host, port = self.remote
                self._rtcp.sendto(self.sender.sender_report(), (host, port + 1))
