"""Who may open a session over a WebSocket: one check for every WebSocket route.

A bad or missing key is refused before the upgrade with HTTP 401, and a server still
starting (no session manager yet) with 503, as JSON errors; where the server cannot send
denial responses the socket is closed with 1008 instead (realtime.websocket.denial).
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from realtime.auth import AuthError, Grant
from realtime.websocket.denial import deny
from sessions import SessionManager

from .services import services_of


async def admit(
    websocket: WebSocket, authorization: str | None
) -> tuple[Grant, SessionManager] | None:
    """The caller's grant and the session manager, or None once the upgrade is refused."""
    services = services_of(websocket)
    try:
        grant = services.auth.check(authorization)
    except AuthError as exc:
        await deny(websocket, 401, "invalid_api_key", str(exc))
        return None
    if services.running is None:
        await deny(websocket, 503, "not_ready", "the server is not ready yet", "server_error")
        return None
    return grant, services.running.manager
