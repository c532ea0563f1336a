"""UDP and TCP listeners on one SIP port (RFC 3261 §18), handing whole messages upward.

UDP: one datagram is one message (over `MAX_MESSAGE_BYTES` is dropped). TCP: messages are
framed by Content-Length; a stream that cannot be framed is closed, since nothing after the
error can be trusted. Each connection's reader task is owned here and cancelled and awaited
in `close()`. The layer above sees a `Peer`: where a message came from, and how to send
back to it (a datagram to an address, or the same connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from .message import MAX_MESSAGE_BYTES, MalformedMessage, frame

log = logging.getLogger(__name__)

MAX_TCP_CONNECTIONS = 256
TCP_IDLE_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True, eq=False)
class Peer:
    protocol: str
    """"UDP" or "TCP"."""
    address: tuple[str, int]
    """The source of the message (host, port)."""
    send: Callable[[bytes, tuple[str, int]], None]
    """Send to an address (UDP) or down this peer's connection (TCP: the address is unused)."""

    @property
    def reliable(self) -> bool:
        return self.protocol == "TCP"


Deliver = Callable[[bytes, Peer], None]


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransport) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.owner._datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        log.debug("sip udp: %s", exc)


class SipTransport:
    def __init__(self, deliver: Deliver, host: str, port: int) -> None:
        self._deliver = deliver
        self.host = host
        self.requested_port = port
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._readers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.udp_port = 0
        self.tcp_port = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for _attempt in range(10):
            udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(self.host, self.requested_port)
            )
            port = udp.get_extra_info("sockname")[1]
            try:
                self._tcp = await asyncio.start_server(
                    self._connection, self.host, port, limit=MAX_MESSAGE_BYTES
                )
            except OSError:
                udp.close()
                if self.requested_port:
                    raise
                continue  # port 0: the UDP port we got is taken for TCP; try another
            self._udp, self.udp_port, self.tcp_port = udp, port, port
            return
        raise OSError("no port free for both UDP and TCP")

    def _datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) > MAX_MESSAGE_BYTES or data.strip(b"\r\n\0 ") == b"":
            return  # oversize, or a keep-alive
        self._deliver(data, Peer("UDP", addr, self.send_udp))

    def send_udp(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._udp is not None and not self._udp.is_closing():
            self._udp.sendto(data, addr)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._writers) >= MAX_TCP_CONNECTIONS or task is None:
            writer.close()
            return
        self._readers.add(task)
        self._writers.add(writer)
        name = writer.get_extra_info("peername")

        def send(data: bytes, _addr: tuple[str, int]) -> None:
            if not writer.is_closing():
                writer.write(data)

        peer = Peer("TCP", (name[0], name[1]), send)
        buffer = bytearray()
        try:
            while True:
                chunk = await asyncio.wait_for(reader.read(65_536), TCP_IDLE_TIMEOUT_S)
                if not chunk:
                    break
                buffer += chunk
                while (data := frame(buffer)) is not None:
                    self._deliver(data, peer)
        except (MalformedMessage, TimeoutError, ConnectionError) as error:
            log.debug("sip tcp %s closed: %s", peer.address, error)
        finally:
            self._readers.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        server, self._tcp = self._tcp, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.close()
        readers = list(self._readers)
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
