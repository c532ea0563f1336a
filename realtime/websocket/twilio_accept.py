"""Accepting a Twilio Media Stream at `/v1/twilio/media`: who may open one, and with what
session settings.

Twilio sends no bearer token, and a `<Stream url>` may not carry a query string, so the
key travels as a custom parameter: `<Parameter name="token" value="<API key or
ephemeral secret>"/>`, which arrives in the `start` message (`customParameters.token`).
A `token` query parameter or an `Authorization: Bearer` header also work (a proxy, a test
client); either is checked before the upgrade, and a wrong one is refused with HTTP 401,
as on the other WebSocket routes. Otherwise the socket is accepted and the `start`
message decides: a missing or wrong token closes it with 1008, and no session is made.
A server with no API key takes every stream. An ephemeral secret's session settings
apply to the stream's session.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.websockets import WebSocket

from realtime.auth import Authenticator, AuthError, Grant
from sessions import ConfigError, SessionConfig, SessionManager

from ..client_events import ProtocolError, SessionUpdate, session_patch
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from .denial import deny
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
    early: Grant | None = None
    if authorization is not None:
        try:
            early = auth.check(authorization)
        except AuthError as exc:
            await deny(websocket, 401, "invalid_api_key", str(exc))
            return
    if manager is None:
        await deny(websocket, 503, "not_ready", "the server is not ready yet", "server_error")
        return

    def config_for(start: Start) -> SessionConfig | None:
        try:
            grant = early or auth.check(_bearer(start.custom_parameters.get(TOKEN_PARAMETER)))
            return session_config(grant)
        except AuthError as exc:
            log.warning("stream %s refused: %s", start.stream_sid, exc)
        except (ConfigError, ProtocolError, ValueError) as exc:
            log.warning("stream %s refused: its secret's settings: %s", start.stream_sid, exc)
        return None

    await websocket.accept()
    await TwilioStream(websocket, manager, config_for, slow).serve()
