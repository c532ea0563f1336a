"""Accepting a Twilio Media Stream at `/v1/twilio/media`: who may open one, and with what
session settings.

Twilio sends no bearer token, and a `<Stream url>` may not carry a query string, so the
key travels as a custom parameter: `<Parameter name="token" value="<API key or
ephemeral secret>"/>`, which arrives in the `start` message (`customParameters.token`).
A `token` query parameter or an `Authorization: Bearer` header also work (a proxy, a test
client); either is checked before the upgrade, and a wrong one is refused with HTTP 401,
as on the other WebSocket routes, and so is a key at its limits (sessions/key_limits.py),
with 429. Otherwise the socket is accepted and the `start` message decides: a missing or
wrong token closes it with 1008, a key at its limits with 1013, and no session is made.
A server with no API key takes every stream. An ephemeral secret's session settings
apply to the stream's session.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.websockets import WebSocket

from sessions import ConfigError, SessionConfig, SessionManager
from sessions.errors import KeyLimitError

from ..auth import Authenticator, AuthError, Grant, with_caller
from ..openai.client_events import ProtocolError, SessionUpdate, session_patch
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.websocket.denial import deny, deny_limited
from .twilio_messages import Start
from .twilio_stream import TwilioStream

log = logging.getLogger("parley.realtime.twilio")

TOKEN_PARAMETER = "token"


def session_config(grant: Grant) -> SessionConfig:
    """The settings a grant carries (an ephemeral secret's), or the defaults."""
    if not grant.session:
        return SessionConfig()
    body: dict[str, Any] = {"type": "realtime", **grant.session}
    patch, _formats = session_patch(SessionUpdate.model_validate({"session": body}))
    return SessionConfig().updated(patch)


def _bearer(token: str | None) -> str | None:
    return f"Bearer {token}" if token else None


async def serve_twilio(
    websocket: WebSocket,
    auth: Authenticator,
    manager: SessionManager | None,
    slow: SlowClients = DEFAULT_SLOW_CLIENTS,
) -> None:
    """Serve one Twilio Media Stream until it ends."""
    authorization = websocket.headers.get("authorization") or _bearer(
        websocket.query_params.get(TOKEN_PARAMETER)
    )
    host = websocket.client.host if websocket.client is not None else None
    early: Grant | None = None
    if authorization is not None:
        try:
            early = with_caller(auth.check(authorization), host)
        except AuthError as exc:
            await deny(websocket, 401, "invalid_api_key", str(exc))
            return
    if manager is None:
        await deny(websocket, 503, "not_ready", "the server is not ready yet", "server_error")
        return
    if early is not None and early.caller is not None:
        try:
            await manager.check_caller(early.caller)
        except KeyLimitError as exc:
            await deny_limited(websocket, exc)
            return

    def config_for(start: Start) -> tuple[SessionConfig, str | None] | None:
        try:
            grant = early or with_caller(
                auth.check(_bearer(start.custom_parameters.get(TOKEN_PARAMETER))), host
            )
            return session_config(grant), grant.caller
        except AuthError as exc:
            log.warning("stream %s refused: %s", start.stream_sid, exc)
        except (ConfigError, ProtocolError, ValueError) as exc:
            log.warning("stream %s refused: its secret's settings: %s", start.stream_sid, exc)
        return None

    await websocket.accept()
    await TwilioStream(websocket, manager, config_for, slow).serve()
