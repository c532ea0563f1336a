"""GPT-Live's `error` event, as every GPT-Live connection sends it."""

from __future__ import annotations

from typing import Any

from sessions.events import new_id

from ..transports.websocket.sender import Message


def live_error(
    code: str,
    message: str,
    client_event_id: str | None = None,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
) -> Message:
    error: dict[str, Any] = {"type": error_type, "code": code, "message": message}
    if client_event_id is not None:
        error["client_event_id"] = client_event_id
    if param is not None:
        error["param"] = param
    message_: Message = {"type": "error", "event_id": new_id("event"), "error": error}
    if client_event_id is not None:
        message_["client_event_id"] = client_event_id
    return message_
