"""uvicorn's sans-I/O WebSocket protocol, reading ahead of the app by a bounded amount.

uvicorn's `WebSocketsSansIOProtocol` stops reading the socket after every message it hands
to the app and starts again when the app takes it: two event-loop registrations (two
`epoll_ctl` calls) per message. A client streaming audio sends 50 messages a second, so with
300 streaming sessions that was 30,000 system calls a second for flow control alone, and
the parse of the next message always waited for the app to take the last.

This subclass pauses reading only once the app is `MAX_QUEUED` messages or `MAX_QUEUED_BYTES`
behind, and resumes once it has caught up: the same backpressure on a client that sends
faster than the app reads (TCP stops it), bounded memory, and no flow-control calls while
the app keeps up.

Its output is bounded too. The kernel grows a socket's send buffer to match the link (up
to 4 MiB by default), and a client that stops reading lets it fill: a minute of audio
before the server's own write blocks and the slow client is noticed at all. A realtime
stream needs a fraction of a second of it in flight, so the send buffer is fixed at
`SEND_BUFFER_BYTES` (the kernel doubles it for its bookkeeping): with uvicorn's 64 KiB
write buffer, a few seconds of audio at most wait for a client that does not read.

It also closes a client that stopped reading. uvicorn's `send` waits for room in the
socket's write buffer before every message, the close frame included, and a client that
does not read never makes room: the app's close gives up, and the transport's close then
waits for the buffer to drain, which it never does. Here the close frame joins the unread
output instead (one small frame more), so a client that reads again sees why it was
closed, and a connection whose output is still not delivered `ABANDON_S` after the close
is dropped (its socket aborted).
"""

from __future__ import annotations

import asyncio
import socket

from uvicorn._types import ASGIReceiveEvent, ASGISendEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

MAX_QUEUED = 16
"""Messages read ahead of the app at most (320 ms of 20 ms audio appends)."""
MAX_QUEUED_BYTES = 1 << 20
"""...and at most this many bytes of them (one larger message is still read whole)."""
SEND_BUFFER_BYTES = 64 * 1024
"""SO_SNDBUF of each WebSocket's socket: 128 KiB in the kernel, ~2 s of PCM16 base64 at
24 kHz; the bandwidth-delay product of a 64 kB/s stream over a 1 s round trip."""
ABANDON_S = 10.0
"""How long a closed connection's unread output may wait for its client before the
socket is aborted."""


class ReadAheadWebSocketProtocol(WebSocketsSansIOProtocol):
    queued_bytes = 0
    abandon_s = ABANDON_S
    _abandon: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        super().connection_made(transport)

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] != "websocket.close" or self.writable.is_set() or self.close_sent:
            await super().send(message)
            return
        # The client is not reading: the close frame goes behind its unread output at once.
        # (`writable` is set only while the base class checks it: it does not yield then.)
        self.writable.set()
        try:
            await super().send(message)
        finally:
            if not self.disconnected:
                self.writable.clear()
        if self._abandon is None:
            self._abandon = self.loop.call_later(self.abandon_s, self._abort_if_unread)

    def _abort_if_unread(self) -> None:
        self._abandon = None
        if not self.disconnected and self.transport.get_write_buffer_size():
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abandon is not None:
            self._abandon.cancel()
            self._abandon = None
        super().connection_lost(exc)

    def send_receive_event_to_app(self) -> None:
        self.queued_bytes += sum(len(frame) for frame in self.frames)
        paused = self.read_paused
        self.read_paused = True  # the base class pauses reading unless already paused
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = paused
        if not paused and self._behind():
            self.read_paused = True
            self.transport.pause_reading()

    async def receive(self) -> ASGIReceiveEvent:
        message = await self.queue.get()
        if self.queue.empty():  # (a text counts its characters out, its bytes in)
            self.queued_bytes = 0
        else:
            data = message.get("text") or message.get("bytes") or b""
            assert isinstance(data, str | bytes)
            self.queued_bytes = max(0, self.queued_bytes - len(data))
        if self.read_paused and not self._behind():
            self.read_paused = False
            self.transport.resume_reading()
        return message

    def _behind(self) -> bool:
        return self.queue.qsize() >= MAX_QUEUED or self.queued_bytes >= MAX_QUEUED_BYTES
