"""Refusing a WebSocket upgrade with an HTTP status, as every WebSocket endpoint does.

A client told "401" before the upgrade knows its key is wrong; a close code after an
accepted upgrade (or the bare 403 that uvicorn sends for a close before accept) says far
less. ASGI servers that support the denial-response extension (uvicorn does) send the
HTTP response; elsewhere the socket closes with 1008.
"""

from __future__ import annotations

import math

from starlette.responses import JSONResponse
from starlette.status import WS_1008_POLICY_VIOLATION
from starlette.websockets import WebSocket

from sessions.errors import KeyLimitError

TOO_MANY_REQUESTS = 429


async def deny(
    websocket: WebSocket,
    status: int,
    code: str,
    message: str,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
) -> None:
    """Refuse the upgrade: an HTTP `status` with an OpenAI-style error body (and `headers`,
    a `Retry-After` say), else 1008."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        body = {"error": {"type": kind, "code": code, "message": message}}
        await websocket.send_denial_response(JSONResponse(body, status, headers))
    else:
        await websocket.close(WS_1008_POLICY_VIOLATION, code)


def retry_after(exc: KeyLimitError) -> dict[str, str]:
    """The `Retry-After` header (whole seconds) for a refusal at a key's rate limit; none
    at its concurrency limit (a slot frees when one of its sessions ends, which no clock
    says)."""
    if exc.retry_after_s is None:
        return {}
    return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}


async def deny_limited(websocket: WebSocket, exc: KeyLimitError) -> None:
    """Refuse the upgrade of a caller at its limits: 429 `rate_limit_exceeded`."""
    await deny(websocket, TOO_MANY_REQUESTS, exc.code, str(exc), exc.error_type, retry_after(exc))
