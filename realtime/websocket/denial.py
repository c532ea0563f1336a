"""Refusing a WebSocket upgrade with an HTTP status, as both WebSocket endpoints do.

A client told "401" before the upgrade knows its key is wrong; a close code after an
accepted upgrade (or the bare 403 that uvicorn sends for a close before accept) says far
less. ASGI servers that support the denial-response extension (uvicorn does) send the
HTTP response; elsewhere the socket closes with 1008.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.status import WS_1008_POLICY_VIOLATION
from starlette.websockets import WebSocket


async def deny(
    websocket: WebSocket,
    status: int,
    code: str,
    message: str,
    kind: str = "invalid_request_error",
) -> None:
    """Refuse the upgrade: an HTTP `status` with an OpenAI-style error body, else 1008."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        body = {"error": {"type": kind, "code": code, "message": message}}
        await websocket.send_denial_response(JSONResponse(body, status))
    else:
        await websocket.close(WS_1008_POLICY_VIOLATION, code)
