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
"""

from __future__ import annotations

from uvicorn._types import ASGIReceiveEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

MAX_QUEUED = 16
"""Messages read ahead of the app at most (320 ms of 20 ms audio appends)."""
MAX_QUEUED_BYTES = 1 << 20
"""...and at most this many bytes of them (one larger message is still read whole)."""


class ReadAheadWebSocketProtocol(WebSocketsSansIOProtocol):
    queued_bytes = 0

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
