"""`/v1/live/sessions`: OpenAI's GPT-Live over a WebSocket, as the `openai` SDK's
`client.live.connect()` opens it (realtime/live/).

Auth is the other WebSocket routes': `Authorization: Bearer <API key or ephemeral
secret>`; a bad key is refused before the upgrade (HTTP 401), as is a caller at its limits
(429). The session's configuration comes in the client's first message, `session.start`.
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from realtime.live.live_accept import serve_live
from sessions import SessionConfig

from .services import services_of
from .ws_admission import admit


async def live_sessions(websocket: WebSocket) -> None:
    admitted = await admit(websocket, websocket.headers.get("authorization"))
    if admitted is None:
        return
    grant, manager = admitted
    services = services_of(websocket)
    await serve_live(
        websocket, manager, base=SessionConfig(), caller=grant.caller, slow=services.slow_clients
    )
