"""A WebSocket client that stops reading, for the slow-client tests.

Its socket has a tiny receive buffer and its transport stops reading once told to: the
server's writes then fill the kernel's buffers and the server's own, as with a client
whose app hangs or whose network stalls. It can read again later (`read_on`) and report
everything that had been sent to it, the close frame included."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, cast

from loadtest.ws_raw_client import masked_frame

TEXT, CLOSE = 0x1, 0x8
RCVBUF = 4096


@dataclass
class Received:
    """What the client read once it read again."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.data = bytearray()
        self.upgraded = asyncio.get_running_loop().create_future()
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.data += data
        if not self.upgraded.done() and b"\r\n\r\n" in self.data:
            head, _, rest = bytes(self.data).partition(b"\r\n\r\n")
            self.data = bytearray(rest)
            if b" 101 " in head.split(b"\r\n", 1)[0]:
                self.upgraded.set_result(None)
            else:
                self.upgraded.set_exception(ConnectionError(head.decode(errors="replace")))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(exc or ConnectionError("closed"))
        self.lost.set()


class StalledClient:
    def __init__(self, protocol: _Protocol) -> None:
        self._protocol = protocol

    @classmethod
    async def open(cls, host: str, port: int, path: str, headers: dict[str, str]) -> StalledClient:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # before the handshake
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
        _, protocol = await loop.create_connection(_Protocol, sock=sock)
        key = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        assert protocol.transport is not None
        protocol.transport.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
            ).encode()
        )
        await protocol.upgraded
        return cls(protocol)

    def send(self, message: dict[str, Any]) -> None:
        transport = self._protocol.transport
        assert transport is not None
        transport.write(masked_frame(TEXT, json.dumps(message).encode()))

    def stop_reading(self) -> None:
        assert self._protocol.transport is not None
        self._protocol.transport.pause_reading()

    async def read_on(self, within_s: float = 10.0) -> Received:
        """Read again, until the close frame (or the connection's end); what came, parsed."""
        assert self._protocol.transport is not None
        self._protocol.transport.resume_reading()
        async with asyncio.timeout(within_s):
            while True:
                received = parse(bytes(self._protocol.data))
                if received.close_code is not None or self._protocol.lost.is_set():
                    return received
                await asyncio.sleep(0.02)

    async def lost(self) -> None:
        """Return once the connection is gone (the server closed or aborted it)."""
        await self._protocol.lost.wait()

    def abort(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.abort()


def parse(data: bytes) -> Received:
    """Server frames (unmasked, unfragmented): the text messages and the close frame."""
    out, at = Received(), 0
    while len(data) - at >= 2:
        opcode, size = data[at] & 0x0F, data[at + 1] & 0x7F
        head = 2
        if size == 126:
            head, size = 4, int.from_bytes(data[at + 2 : at + 4], "big")
        elif size == 127:
            head, size = 10, int.from_bytes(data[at + 2 : at + 10], "big")
        if len(data) - at < head + size:
            break
        payload = data[at + head : at + head + size]
        at += head + size
        if opcode == TEXT:
            out.messages.append(json.loads(payload))
        elif opcode == CLOSE:
            out.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            out.close_reason = payload[2:].decode()
            break
    return out
