"""Plain-dict forms of events and items, for Redis records and as a base for transports."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from pydantic import BaseModel

from .events import ConversationItem, Event


def to_plain(value: Any) -> Any:
    """Dataclasses, pydantic models, bytes and tuples -> JSON-safe values."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def event_to_dict(event: Event) -> dict[str, Any]:
    body = to_plain(event)
    assert isinstance(body, dict)
    return {"type": event.type, **body}


def item_to_json(item: ConversationItem) -> str:
    return json.dumps(to_plain(item), separators=(",", ":"))


def item_from_json(raw: str | bytes) -> ConversationItem:
    return ConversationItem(**json.loads(raw))
