"""GPT-Live's sideband: a server-side controller attached to a running live session.

An application keeps its logic off the device that holds the session (a browser, a phone)
by attaching its own server to the session: `/v1/live/sessions/{id}/attach` with its key,
as the `openai` SDK's `client.live.sideband.connect(session_id=...)` opens it. The
sideband is a second connection to the session:

- It reads what the session's own connection is sent, from the moment it attaches: every
  event but the audio (the voice stays with the device), so a controller sees the
  transcripts, the acknowledgements, the delegations and the errors.
- It sends the session's client events (instructions, thinking, commentary, the Responses
  delegation's outputs, `session.update`, mute and unmute, `session.close`), applied as
  if the session's own connection had sent them: their answers go to both, each naming
  the client's `event_id`. The microphone's audio is the device's: an audio append from a
  sideband is refused, as is a second `session.start`.
- Its end leaves the session alone; the session's end closes it (normally, 1000) after the
  `session.closed` it is sent, with or without `graceful_close`.

Sidebands attach to sessions served by this process (`LiveSessions`; one on another worker
process is relayed there and served the same way: realtime/sideband_relay.py), whatever carries
the session's audio: what they attach to is the session's `LiveProtocol` (live_protocol.py),
which a GPT-Live WebSocket and a GPT-Live SIP call (realtime/live/live_sip_call.py) both host.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt
from starlette.websockets import WebSocket

from sessions import SessionManager

from ..sideband_relay import Serve
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.websocket.connection import CLOSE_NORMAL, MessageConnection
from ..transports.websocket.sender import Message
from .live_errors import live_error

if TYPE_CHECKING:
    from .live_protocol import LiveProtocol
    from .live_store import StoredSessions

log = logging.getLogger("parley.realtime.live")

SESSION_ENDED = "session_ended"
DEVICE_ONLY = frozenset({"session.input_audio.append", "session.start"})
"""What only the session's own connection sends (a sideband may mute the microphone)."""


class LiveSessions:
    """This process's live sessions by id, for sidebands to find; and where those with
    `store: true` are kept when they end (`stored`, set once Redis is open)."""

    def __init__(self) -> None:
        self._by_id: dict[str, LiveProtocol] = {}
        self.stored: StoredSessions | None = None

    def record(self, primary: LiveProtocol) -> None:
        """Start the recording of a session that asked to be stored."""
        if primary.live.store and self.stored is not None and primary.recording is None:
            primary.recording = self.stored.recorder()

    async def keep(self, primary: LiveProtocol) -> None:
        """Store an ended session that asked for it (live_store.py). Once only."""
        session, recording = primary.session, primary.recording
        if self.stored is None or session is None or recording is None:
            return
        primary.recording = None
        items = await session.history.items()
        await self.stored.save(session.session_id, primary.live, items, recording)

    def add(self, session_id: str, primary: LiveProtocol) -> None:
        self._by_id[session_id] = primary

    def discard(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    def get(self, session_id: str) -> LiveProtocol | None:
        return self._by_id.get(session_id)

    def __len__(self) -> int:
        return len(self._by_id)


def find_live_sideband(
    live_sessions: LiveSessions,
    manager: SessionManager,
    session_id: str,
    slow: SlowClients = DEFAULT_SLOW_CLIENTS,
) -> Serve | None:
    """How to serve a sideband of this process's live session `session_id` on a
    WebSocket; None when there is no such session here, or it has ended."""
    primary = live_sessions.get(session_id)
    if primary is None or primary.session is None or primary.session.closed:
        return None

    async def serve(websocket: WebSocket, subprotocol: str | None) -> None:
        await serve_live_sideband(websocket, manager, primary, slow)

    return serve


async def serve_live_sideband(
    websocket: WebSocket,
    manager: SessionManager,
    primary: LiveProtocol,
    slow: SlowClients = DEFAULT_SLOW_CLIENTS,
) -> None:
    """Serve one sideband WebSocket (not yet accepted) on `primary`'s session until
    either ends."""
    sideband = LiveSideband(websocket, manager, primary, slow=slow)
    attached = primary.attach_sideband(sideband)  # before the upgrade: nothing is missed
    try:
        await websocket.accept()
        if not attached:
            sideband.finish(SESSION_ENDED)
            await sideband.close_socket()
            return
        await sideband.serve(None)
    finally:
        primary.detach_sideband(sideband)
        await sideband.close_socket()


class LiveSideband(MessageConnection):
    TRANSPORT: ClassVar[str] = "live_sideband"
    OWNS_SESSION: ClassVar[bool] = False
    RESUMABLE: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        websocket: WebSocket,
        manager: SessionManager,
        primary: LiveProtocol,
        *,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    ) -> None:
        super().__init__(websocket, manager, _no_audio, grace_s=0, slow=slow)
        self.primary = primary
        self.session = primary.session

    def forward(self, message: Message) -> None:
        """One message the session's own connection was sent (never its audio)."""
        self.post(message)
        if message.get("type") == "session.closed":
            self.finish(SESSION_ENDED, CLOSE_NORMAL)

    def messages(self, event: Any) -> list[tuple[Message, bool]]:
        return []  # the session's events reach a sideband as its connection's messages

    async def handle(self, raw: str | bytes) -> bool:
        kind: Any = None
        event_id: Any = None
        try:
            event = json.loads(raw)
            if isinstance(event, dict):
                kind, event_id = event.get("type"), event.get("event_id")
        except (ValueError, UnicodeDecodeError):
            pass
        if kind in DEVICE_ONLY:
            client_id = event_id if isinstance(event_id, str) else None
            why = f"{kind} comes from the session's own connection, not a sideband"
            self.post(live_error("invalid_request", why, client_id, param="type"))
            return False
        await self.primary.handle_raw(raw)
        return False

    def error_message(self, code: str, text: str) -> Message:
        return live_error(code, text)


def _no_audio(pcm: npt.NDArray[np.int16], rate: int) -> Message:
    raise AssertionError("a sideband is never sent audio")
