"""`/v1/live/sessions`: OpenAI's GPT-Live over a WebSocket, as the `openai` SDK's
`client.live.connect()` opens it (realtime/live/).

Auth is the other WebSocket routes': `Authorization: Bearer <API key or ephemeral
secret>`; a bad key is refused before the upgrade (HTTP 401), as is a caller at its limits
(429). The session's configuration comes in the client's first message, `session.start`.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from starlette.websockets import WebSocket

from realtime.live.live_accept import serve_live
from realtime.live.live_relay import relay_sideband
from realtime.live.live_sideband import LiveSideband
from realtime.websocket.denial import deny
from sessions import SessionConfig, SessionManager

from .services import services_of
from .ws_admission import admit


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
    is reached through a relay over Redis (realtime/live/live_relay.py)."""
    admitted = await admit(websocket, websocket.headers.get("authorization"), new_session=False)
    if admitted is None:
        return
    _, manager = admitted
    services = services_of(websocket)
    session_id = websocket.path_params["session_id"]
    primary = services.live_sessions.get(session_id)
    if primary is None or primary.session is None or primary.session.closed:
        if not await _relayed(websocket, manager, services.redis, session_id):
            await deny(websocket, 404, "session_not_found", f"no live session {session_id!r}")
        return
    sideband = LiveSideband(websocket, manager, primary, slow=services.slow_clients)
    attached = primary.attach_sideband(sideband)  # before the upgrade: nothing is missed
    try:
        await websocket.accept()
        if not attached:
            sideband.finish("session_ended")
            await sideband.close_socket()
            return
        await sideband.serve(None)
    finally:
        primary.detach_sideband(sideband)
        await sideband.close_socket()


async def _relayed(
    websocket: WebSocket, manager: SessionManager, redis: aioredis.Redis | None, session_id: str
) -> bool:
    """A sideband of a session another worker process owns, relayed from there
    (realtime/live/live_relay.py); False when no live process has it."""
    if redis is None:
        return False
    owner = await manager.ownership.owner(session_id)
    if owner is None or owner == manager.process_id or not await manager.beat.alive(owner):
        return False
    return await relay_sideband(websocket, redis, manager.beat, owner, session_id)
