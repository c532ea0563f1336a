"""Starting a GPT-Live session on an accepted WebSocket: `session.start` first.

GPT-Live's primary WebSocket carries no configuration in its URL: the client's first
message is `session.start` with the whole session configuration, and nothing else may
come before the server's `session.started`. A first message that is not a valid
`session.start` gets an `error` (with the client's `event_id`, naming the bad field) and
a close with 1008; no session is made. Waiting for it is bounded (`START_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Literal

from starlette.websockets import WebSocket, WebSocketDisconnect

from sessions import Session, SessionConfig, SessionLimitError, SessionManager
from sessions.events import ConversationItem

from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.websocket.connection import CLOSE_POLICY, CLOSE_TRY_AGAIN
from .live_config import LiveConfigError, LiveSessionConfig, parley_config, parse_live_config
from .live_connection import LiveConnection
from .live_errors import live_error
from .live_sideband import LiveSessions

log = logging.getLogger("parley.realtime.live")

START_TIMEOUT_S = 60.0
"""How long an accepted socket may wait for its `session.start` (a framework connects when
its pipeline starts and starts the session when the app first runs it), as long as an idle
session lives."""

ROLES: dict[str, Literal["user", "assistant", "system"]] = {
    "developer": "system",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
}


async def serve_live(
    websocket: WebSocket,
    manager: SessionManager,
    *,
    base: SessionConfig,
    caller: str | None = None,
    slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    live_sessions: LiveSessions | None = None,
    parse: Callable[[Any], LiveSessionConfig] = parse_live_config,
) -> None:
    """Serve one GPT-Live WebSocket (already admitted) until it closes; `live_sessions`
    knows it meanwhile (for sidebands). `parse` reads `session.start`'s `session` (a
    fork's makes the stored session's config from its overrides: live_fork.py)."""
    await websocket.accept()
    start = await _session_start(websocket, parse)
    if start is None:
        return
    live, client_id = start
    try:
        config, formats = parley_config(live, base)
    except LiveConfigError as exc:
        await _refuse(websocket, live_error(exc.code, str(exc), client_id, param=exc.param))
        return
    connection = LiveConnection(websocket, manager, live=live, formats=formats, slow=slow)
    await _serve_session(
        websocket, manager, connection, live, config, client_id, caller, live_sessions
    )


async def _serve_session(
    websocket: WebSocket,
    manager: SessionManager,
    connection: LiveConnection,
    live: LiveSessionConfig,
    config: SessionConfig,
    client_id: str | None,
    caller: str | None,
    live_sessions: LiveSessions | None,
) -> None:
    try:
        session = await manager.create(connection, config, caller=caller)
    except SessionLimitError as exc:  # or KeyLimitError: `rate_limit_exceeded`
        error = live_error(exc.code, str(exc), client_id, error_type=exc.error_type)
        await _refuse(websocket, error, CLOSE_TRY_AGAIN)
        return
    try:
        connection.bind(session)
        await seed_history(session, live)
        connection.post(connection.protocol.started(client_id))
        if live_sessions is not None:
            live_sessions.add(session.session_id, connection.protocol)
            live_sessions.record(connection.protocol)
        await connection.serve(None)
    finally:
        if live_sessions is not None:
            live_sessions.discard(session.session_id)
        await connection.close_socket()
        if live_sessions is not None:
            await live_sessions.keep(connection.protocol)


async def seed_history(session: Session, live: LiveSessionConfig) -> None:
    """The history given at start (`input`), into the session's conversation."""
    for item in live.input or ():
        text = item.content[0].text
        await session.add_item(ConversationItem(role=ROLES[item.role], text=text))


async def _session_start(
    websocket: WebSocket, parse: Callable[[Any], LiveSessionConfig]
) -> tuple[LiveSessionConfig, str | None] | None:
    """The first message as a `session.start`, or None once the client was told why not."""
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            raw = await websocket.receive_text()
    except TimeoutError:
        await _refuse(websocket, live_error("session_not_started", "no session.start came"))
        return None
    except (WebSocketDisconnect, RuntimeError, KeyError):
        return None  # gone before it started (or sent bytes: not a Live client)
    try:
        event: Any = json.loads(raw)
    except ValueError:
        await _refuse(websocket, live_error("invalid_json", "the first message is not JSON"))
        return None
    client_id = event.get("event_id") if isinstance(event, dict) else None
    client_id = client_id if isinstance(client_id, str) else None
    if not isinstance(event, dict) or event.get("type") != "session.start":
        kind = event.get("type") if isinstance(event, dict) else None
        text = f"the first message must be session.start, not {kind!r}"
        await _refuse(websocket, live_error("session_not_started", text, client_id))
        return None
    extra = sorted(set(event) - {"type", "session", "event_id"})
    if extra:
        text = f"session.start has no field {extra[0]!r}"
        await _refuse(websocket, live_error("unknown_parameter", text, client_id, param=extra[0]))
        return None
    try:
        return parse(event.get("session")), client_id
    except LiveConfigError as exc:
        await _refuse(websocket, live_error(exc.code, str(exc), client_id, param=exc.param))
        return None


async def _refuse(websocket: WebSocket, error: dict[str, Any], code: int = CLOSE_POLICY) -> None:
    log.info("GPT-Live session refused: %s", error["error"]["message"])
    with contextlib.suppress(Exception):
        await websocket.send_text(json.dumps(error))
        await websocket.close(code, error["error"]["code"])
