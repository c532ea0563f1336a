"""A client that stops reading: how long it may, what it is told, where it shows.

Every transport keeps what it sends bounded. On a WebSocket (websocket/sender.py) audio
pieces and events share one queue of `max_items`, audio at most `max_queued_ms` ahead
(the model waits past that), and the socket's own buffers are fixed (web/ws_protocol.py);
the WebRTC data channel drops events past its buffer bound (webrtc/call_events.py). A
client that does not read so costs a bounded amount of memory, but it would still hold
its session, its slot and a stalled answer for ever. So once its output has made no
progress for `stall_s` (a WebSocket write that does not complete, a queue that stays too
full to take more, a data channel whose unsent bytes do not go down), it is closed:

- WebSockets: close code 1008 (policy violation) with the reason `client_too_slow` where
  the protocol carries reasons. Not 1013 (try again later: the server is not overloaded,
  and a retry would stall the same way), not 1011 (no server error), not a 4xxx code
  (SDKs know the standard codes only). The close frame joins the output the client has
  not read (web/ws_protocol.py), so a client that reads again sees it after that output;
  one that never does has its TCP connection dropped soon after. A WebRTC call is hung
  up (its data channel carries its events; there is no close code to give).
- its session ends with the reason `client_too_slow`, not detached for a resume: the
  server chose to close it, and a resume would replay the backlog into the same stalled
  pipe. (A network outage long enough to fill the socket buffers and stall the sender
  for `stall_s` mid-answer ends the session the same way; a shorter one does not.)
- one warning in the log with the session id, and the counter
  `parley_slow_clients_closed{transport}`.

Other sessions are untouched: each connection has its own sender task and queue, and a
blocked write blocks only that task.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from starlette import status

from .metrics import TransportMetrics

log = logging.getLogger("parley.realtime.slow_clients")

CLOSE_TOO_SLOW = status.WS_1008_POLICY_VIOLATION
DEFAULT_STALL_S = 10.0
"""How long a client may leave the server's output unread before it is closed."""
TOO_SLOW = "client_too_slow"
"""The session's close reason, and the close frame's (where the protocol says why)."""


@dataclass(frozen=True, slots=True)
class SlowClients:
    """The server's policy on clients that stop reading, shared by its transports."""

    stall_s: float = DEFAULT_STALL_S
    """`--slow-client-s`: how long the output may stay blocked."""
    metrics: TransportMetrics | None = None

    def closed(self, transport: str, session_id: str | None, why: str) -> None:
        """Note one client closed as too slow: logged once, counted once."""
        log.warning(
            "session %s (%s): closed %d %s: %s",
            session_id or "-",
            transport,
            CLOSE_TOO_SLOW,
            TOO_SLOW,
            why,
        )
        if self.metrics is not None:
            self.metrics.slow_clients.labels(transport).inc()


DEFAULT_SLOW_CLIENTS = SlowClients()
"""The default policy, uncounted (a server passes its own, with its metrics)."""
