"""`/v1/live/sessions`: OpenAI's GPT-Live over a WebSocket, as the `openai` SDK's
`client.live.connect()` opens it (realtime/live/).

Auth is the other WebSocket routes': `Authorization: Bearer <API key or ephemeral
secret>`; a bad key is refused before the upgrade (HTTP 401), as is a caller at its limits
(429). The session's configuration comes in the client's first message, `session.start`.
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from realtime.live.live_accept import serve_live
from realtime.live.live_sideband import find_live_sideband
from realtime.sideband_relay import relay_sideband
from realtime.transports.websocket.denial import deny
from sessions import SessionConfig

from .services import services_of
from .ws_admission import admit

LIVE_SIDEBAND = "live"
"""The protocol's name among relayed sidebands (realtime/sideband_relay.py)."""


async def live_sessions(websocket: WebSocket) -> None:
    admitted = await admit(websocket, websocket.headers.get("authorization"))
    if admitted is None:
        return
    grant, manager = admitted
    services = services_of(websocket)
    await serve_live(
        websocket,
        manager,
        base=SessionConfig(),
        caller=grant.caller,
        slow=services.slow_clients,
        live_sessions=services.live_sessions,
    )


async def live_attach(websocket: WebSocket) -> None:
    """`/v1/live/sessions/{session_id}/attach`: a sideband on a live session of this
    process (realtime/live/live_sideband.py); an unknown or ended one is refused (404)
    before the upgrade. `graceful_close` is accepted: the session's end always closes a
    sideband normally, after its `session.closed`. A session another worker process owns
    is reached through a relay over Redis (realtime/sideband_relay.py)."""
    admitted = await admit(websocket, websocket.headers.get("authorization"), new_session=False)
    if admitted is None:
        return
    _, manager = admitted
    services = services_of(websocket)
    session_id = websocket.path_params["session_id"]
    serve = find_live_sideband(services.live_sessions, manager, session_id, services.slow_clients)
    if serve is not None:
        await serve(websocket, None)
        return
    if services.redis is not None:
        owner = await manager.ownership.owner(session_id)
        request = {"protocol": LIVE_SIDEBAND, "target": session_id}
        if await relay_sideband(websocket, services.redis, manager.beat, owner, request):
            return
    await deny(websocket, 404, "session_not_found", f"no live session {session_id!r}")
