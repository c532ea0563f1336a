"""Who may open a session over a WebSocket: one check for every WebSocket route.

A bad or missing key is refused before the upgrade with HTTP 401, and a server still
starting (no session manager yet) with 503, as JSON errors; where the server cannot send
denial responses the socket is closed with 1008 instead (realtime.transports.websocket.denial).

A connection that will start a new session is also checked against its caller's limits
(sessions/key_limits.py: its API key's, or, with no key, its address's) and refused with
429 `rate_limit_exceeded` when its key (or address) holds as many sessions as it may or
has started them too fast. The check takes nothing: the session's creation after the
upgrade decides for good (two connections racing for a key's last slot: the loser is
refused after the upgrade, with the same error code).
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from realtime.auth import AuthError, Grant, with_caller
from realtime.transports.websocket.denial import deny, deny_limited
from sessions import SessionManager
from sessions.errors import KeyLimitError

from .services import services_of


async def admit(
    websocket: WebSocket, authorization: str | None, *, new_session: bool = True
) -> tuple[Grant, SessionManager] | None:
    """The caller's grant (its caller named) and the session manager, or None once the
    upgrade is refused. `new_session`: False for a connection that resumes or attaches to
    a session, which its caller's limits do not refuse."""
    services = services_of(websocket)
    try:
        host = websocket.client.host if websocket.client is not None else None
        grant = with_caller(services.auth.check(authorization), host)
    except AuthError as exc:
        await deny(websocket, 401, "invalid_api_key", str(exc))
        return None
    if services.running is None:
        await deny(websocket, 503, "not_ready", "the server is not ready yet", "server_error")
        return None
    manager = services.running.manager
    if new_session and grant.caller is not None:
        try:
            await manager.check_caller(grant.caller)
        except KeyLimitError as exc:  # logged and counted by the manager
            await deny_limited(websocket, exc)
            return None
    return grant, manager
