"""A sideband connection: a server-side controller attached to a running call (WebRTC or SIP).

OpenAI's pattern for keeping tools and business logic off the browser ("Webhooks and
server-side controls"): the browser holds the call, media and data channel, and the
application's server opens `/v1/realtime?call_id=<the id in the call's Location>` with
its own key. That WebSocket is a second connection to the call's session:

- It reads the session's events as the data channel carries them, from the moment it
  attaches: the same GA sequence (its own expander) and the call's
  `output_audio_buffer.*` news, no audio deltas (the audio is on the WebRTC track), and no
  `session.created` (the session was created with the call).
- It sends client events (`session.update`, `response.create`,
  `conversation.item.create`, ...), applied to the call's session by a dispatcher of its
  own with the call's rules: no `input_audio_buffer.append` (the microphone is the
  track), audio formats ignored (the SDP set them), `output_audio_buffer.clear` clears the
  call's playout. An `error` about its event is the session's, so the data channel sees
  it too; each names the client's `event_id`.
- Its end leaves the call alone (the session is the call's: OWNS_SESSION is False); it
  cannot be resumed, and reconnecting with the call id again attaches anew. The call's end
  closes it with 1000 and a reason saying why the call ended. A sideband that stops
  reading is closed as any OpenAI WebSocket client is (1008), and the call goes on.
"""

from __future__ import annotations

import logging
from typing import Protocol

from starlette.websockets import WebSocket

from sessions import Session, SessionManager
from sessions.events import Event, SessionClosed

from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.websocket.connection import CLOSE_NORMAL
from .call_events import CallEvents, CallListener
from .client_events import AudioFormats
from .dispatch import ClientEventDispatcher
from .websocket import ERROR_LIMIT, OpenAIRealtimeConnection

log = logging.getLogger("parley.realtime.websocket.sideband")

CALL_ENDED = "call_ended"


class SidebandCall(Protocol):
    """What a sideband needs of a call: a WebRTC call (realtime/transports/webrtc/call.py) and a
    SIP call (realtime/transports/sip/media_call.py) both are one. Either way the microphone
    is the call's media, so the sideband follows the WebRTC transport's rules."""

    @property
    def call_id(self) -> str: ...
    @property
    def session(self) -> Session | None: ...
    @property
    def close_reason(self) -> str: ...
    @property
    def events(self) -> CallEvents: ...
    @property
    def live_session_id(self) -> str | None: ...
    def listen(self, listener: CallListener) -> bool: ...
    def unlisten(self, listener: CallListener) -> None: ...
    def clear(self) -> None: ...


class SidebandConnection(OpenAIRealtimeConnection):
    TRANSPORT = "sideband"
    OWNS_SESSION = False

    def __init__(
        self,
        websocket: WebSocket,
        manager: SessionManager,
        call: SidebandCall,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    ) -> None:
        session = call.session
        assert session is not None  # a registered call is attached to its session
        formats = AudioFormats.for_config(session.config)
        super().__init__(websocket, manager, formats=formats, slow=slow)
        self.call = call
        self.bind(session)

    def new_dispatcher(self, session: Session) -> ClientEventDispatcher:
        """The call's rules: the WebRTC transport's, clearing the call's playout."""
        return ClientEventDispatcher(
            session, transport="webrtc", clear_output=self.call.clear, error_limit=ERROR_LIMIT
        )

    def event(self, event: Event) -> None:
        if isinstance(event, SessionClosed):  # the call's session: the call is ending
            self.call_ended(event.reason)
        super().event(event)

    def call_ended(self, reason: str) -> None:
        """The call has ended: what is queued goes out, then a close frame saying why."""
        self.finish(f"{CALL_ENDED}: {reason}" if reason else CALL_ENDED, CLOSE_NORMAL)


async def serve_sideband(
    websocket: WebSocket,
    manager: SessionManager,
    call: SidebandCall,
    subprotocol: str | None,
    slow: SlowClients = DEFAULT_SLOW_CLIENTS,
) -> None:
    """Serve one sideband WebSocket on `call` until either ends. The route has checked the
    caller's key and that the call exists. A sideband client that stops reading is closed
    (1008); the call goes on."""
    connection = SidebandConnection(websocket, manager, call, slow)
    # Listening before the upgrade completes: an event the client's first message causes
    # cannot come before the connection hears it.
    attached = call.listen(connection)
    try:
        await websocket.accept(subprotocol=subprotocol)
        if not attached:
            connection.call_ended(call.close_reason)
            await connection.close_socket()
            return
        log.info("call %s: sideband attached", call.call_id)
        await connection.serve(None)
        log.info("call %s: sideband closed (%s)", call.call_id, connection.close_reason)
    finally:
        call.unlisten(connection)
        await connection.close_socket()
