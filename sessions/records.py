"""Plain-dict forms of events and items, for Redis records and as a base for transports."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from typing import Any

from pydantic import BaseModel

from pipeline.types import TokenLogprob

from . import events, mcp_events
from .config import SessionConfig
from .events import ConversationItem, Event, ResponseUsage


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


def event_from_dict(body: dict[str, Any]) -> Event:
    """The inverse of `event_to_dict`, for events read back from the event log.

    Raises KeyError for an unknown type (a newer process wrote it) and TypeError or
    ValueError for a body that does not fit its type.
    """
    cls = _event_types()[body["type"]]
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in body:
            continue
        value = body[f.name]
        if f.name == "config" and isinstance(value, dict):
            value = SessionConfig.model_validate(value)
        elif f.name == "item" and isinstance(value, dict):
            value = ConversationItem(**value)
        elif f.name == "calls" and isinstance(value, list):
            value = tuple(ConversationItem(**call) for call in value)
        elif f.name == "usage" and isinstance(value, dict):
            value = ResponseUsage(**value)
        elif f.name == "pcm" and isinstance(value, str):
            value = base64.b64decode(value)
        elif f.name == "logprobs" and isinstance(value, list):
            value = tuple(
                TokenLogprob(t["token"], t["logprob"], base64.b64decode(t["utf8"])) for t in value
            )
        fields[f.name] = value
    return cls(**fields)


@functools.cache
def _event_types() -> dict[str, type[Event]]:
    # The module's own names: dataclass(slots=True) replaces each class, and the replaced
    # originals may linger among Event.__subclasses__().
    return {
        obj.type: obj
        for module in (events, mcp_events)
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, Event) and obj is not Event
    }


def item_to_json(item: ConversationItem) -> str:
    return json.dumps(to_plain(item), separators=(",", ":"))


def item_from_json(raw: str | bytes) -> ConversationItem:
    return ConversationItem(**json.loads(raw))
