"""Accepting an OpenAI Realtime WebSocket: a new session, or the resume of a live one.

The web route authenticates and reads the upgrade request into a `ConnectRequest`; this
accepts the socket and binds it to its session. Refusals after the upgrade are an
`error` event and a close: `session_limit` (1013, try again later: also a resume that
reaches a draining process), `rate_limit_exceeded` (1013: the caller's key at its limits,
found by the session's creation after the route's check let it through),
`session_not_found` (1008: unknown session or wrong resume token), `invalid_config` (1008:
a transcription session on a pipeline with no recogniser). A resume may reach any
process (connections.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket

from sessions import (
    ConfigError,
    SessionClosedError,
    SessionConfig,
    SessionLimitError,
    SessionManager,
)

from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.websocket.connection import CLOSE_POLICY, CLOSE_TRY_AGAIN
from ..transports.websocket.connections import DEFAULT_GRACE_S, ConnectionRegistry, claim_session
from .client_events import AudioFormats
from .websocket import OpenAIRealtimeConnection

log = logging.getLogger("parley.realtime.websocket.accept")


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """What the route read from the upgrade request, after auth."""

    config: SessionConfig
    """Settings for a new session (an ephemeral secret may carry some)."""
    formats: AudioFormats
    beta: bool = False
    subprotocol: str | None = None
    session_id: str | None = None
    resume_token: str | None = None
    last_event_id: str | None = None
    grace_s: float = DEFAULT_GRACE_S
    caller: str | None = None
    """Whom its session counts against (sessions/key_limits.py)."""
    slow: SlowClients = DEFAULT_SLOW_CLIENTS


class OpenAIConnections(ConnectionRegistry[OpenAIRealtimeConnection]):
    """Per process: the OpenAI Realtime connection that last served each session.

    A resume asks here for the old connection: to take the session over from it (a
    half-open socket the server has not noticed yet) and to keep its audio formats.
    """


async def serve_openai_realtime(
    websocket: WebSocket,
    manager: SessionManager,
    connections: OpenAIConnections,
    request: ConnectRequest,
) -> None:
    """Serve one accepted-to-be WebSocket until it closes."""
    await websocket.accept(subprotocol=request.subprotocol)
    connection = OpenAIRealtimeConnection(
        websocket,
        manager,
        formats=request.formats,
        beta=request.beta,
        grace_s=request.grace_s,
        slow=request.slow,
    )
    try:
        if request.session_id is not None:
            bound = await _resume(connection, connections, request)
        else:
            bound = await _start(connection, request)
        if bound:
            await connection.serve(connections)
    finally:
        await connection.close_socket()


async def _start(connection: OpenAIRealtimeConnection, request: ConnectRequest) -> bool:
    try:
        session = await connection.manager.create(connection, request.config, caller=request.caller)
    except SessionLimitError as exc:  # or KeyLimitError: `rate_limit_exceeded`
        await connection.refuse(exc.code, str(exc), CLOSE_TRY_AGAIN, exc.error_type)
        return False
    except ConfigError as exc:  # a transcription session on a pipeline with no recogniser
        await connection.refuse(exc.code, str(exc), CLOSE_POLICY)
        return False
    connection.bind(session)
    return True


async def _resume(
    connection: OpenAIRealtimeConnection, connections: OpenAIConnections, request: ConnectRequest
) -> bool:
    assert request.session_id is not None
    try:
        claimed = await claim_session(
            connection.manager,
            connections,
            request.session_id,
            request.resume_token,
            caller=request.caller,
        )
    except SessionLimitError as exc:
        await connection.refuse("session_limit", str(exc), CLOSE_TRY_AGAIN, "server_error")
        return False
    if claimed is None:
        await connection.refuse(
            "session_not_found",
            f"no resumable session {request.session_id} (it ended, or the token is wrong)",
            CLOSE_POLICY,
        )
        return False
    session, old = claimed
    formats = old.formats if old is not None else kept_formats(session.transport, session.config)
    try:
        connection.resume_into(session, request.last_event_id)
    except SessionClosedError:
        await connection.refuse("session_not_found", "the session has just ended", CLOSE_POLICY)
        return False
    connection.bind(session, formats)
    log.info("session %s resumed after %s", session.session_id, request.last_event_id)
    return True


def kept_formats(state: dict[str, Any], config: SessionConfig) -> AudioFormats:
    """The audio formats the last connection kept in the session record (a resume on
    another process); PCM at the session's rates when there are none."""
    kept = state.get("formats")
    if isinstance(kept, dict):
        try:
            return AudioFormats(**kept)
        except TypeError:
            pass
    return AudioFormats.for_config(config)
