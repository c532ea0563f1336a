"""A bare WebSocket client for the load generator: the handshake and frame headers, no more.

Hundreds of streaming sessions in one generator process spend most of its CPU receiving:
every answer is ~40 server messages, ~20 of them 6 kB of base64 audio, and a full client
(websockets) parses, assembles and UTF-8-decodes each one. The generator reads a single
event from all of that (`speech_stopped`), so this client only walks the frame headers,
hands each text message's bytes to a callback undecoded, and answers pings (the server
closes a connection that does not). What it sends, the caller builds (pre-masked frames).
Server frames are never masked and, from uvicorn, never fragmented; a fragment or a close
ends the connection here.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import numpy as np

TEXT, CLOSE, PING = 0x1, 0x8, 0x9


class RawWebSocket(asyncio.Protocol):
    def __init__(self, on_text: Callable[[bytes], None]) -> None:
        self.on_text = on_text
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buffer = bytearray()
        self._upgraded = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.opened, self.closed):
            if not future.done():
                future.set_exception(exc or ConnectionError("closed"))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._upgraded:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(self._buffer[: self._buffer.find(b"\r\n")])
            del self._buffer[: end + 4]
            if b" 101 " not in status:
                self._fail(f"handshake refused: {status.decode(errors='replace')}")
                return
            self._upgraded = True
            self.opened.set_result(None)
        self._frames()

    def _frames(self) -> None:
        buf, at = self._buffer, 0
        while len(buf) - at >= 2:
            fin_op, size = buf[at], buf[at + 1] & 0x7F
            head = 2
            if size == 126:
                head, size = 4, int.from_bytes(buf[at + 2 : at + 4], "big")
            elif size == 127:
                head, size = 10, int.from_bytes(buf[at + 2 : at + 10], "big")
            if len(buf) - at < head + size:
                break
            payload = bytes(buf[at + head : at + head + size])
            at += head + size
            opcode = fin_op & 0x0F
            if not fin_op & 0x80 or opcode == 0 or opcode == CLOSE:
                self._fail("a fragmented message or a close")
                return
            if opcode == TEXT:
                self.on_text(payload)
            elif opcode == PING:
                self.write(masked_frame(0xA, payload))
        del buf[:at]

    def close(self) -> None:
        """Say goodbye (1000) and hang up: a client that just vanished would leave its
        session waiting for a resume."""
        self.write(masked_frame(CLOSE, (1000).to_bytes(2, "big")))
        if self.transport is not None:
            self.transport.close()

    def write(self, frame: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame)

    def _fail(self, why: str) -> None:
        if self.transport is not None:
            self.transport.close()
        for future in (self.opened, self.closed):
            if not future.done():
                future.set_exception(ConnectionError(why))


def masked_frame(opcode: int, payload: bytes, key: bytes | None = None) -> bytes:
    """One final client frame. Clients must mask; the key is drawn per frame unless given
    (the bench pre-builds its frames once, under one key: the server unmasks either)."""
    key = os.urandom(4) if key is None else key
    size = len(payload)
    if size < 126:
        head = bytes([0x80 | opcode, 0x80 | size])
    elif size < 1 << 16:
        head = bytes([0x80 | opcode, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + size.to_bytes(8, "big")
    body = np.frombuffer(payload, np.uint8) ^ np.resize(np.frombuffer(key, np.uint8), size)
    return head + key + body.tobytes()


async def open_raw(url: str, on_text: Callable[[bytes], None]) -> RawWebSocket:
    """Connect to `ws://host:port/path?query` and wait for the upgrade."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: RawWebSocket(on_text), host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    client.write(
        (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    await client.opened
    return client
