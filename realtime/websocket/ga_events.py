"""The full GA event sequence around the session's events, for one connection.

The session emits what it knows: a response was created, an item was created, deltas, the
response is done. An OpenAI Realtime (GA) client expects more: the output item and its
content part announced and finished, the transcript or text in full at the end,
`conversation.item.added` / `.done`, and `rate_limits.updated`. `GAExpander` adds them.
It keeps a little state per connection (the response in progress, its text so far, the
length of user audio awaiting its transcript), so each connection has its own.
`...input_audio_transcription.completed` gets its `usage` here (OpenAI's duration form):
the session's event names the item, the item's creation said how long its audio was.

Ids are deterministic, so a resumed connection, which runs the event log through a fresh
expander, sends the very same ids again: the session event keeps its own id, and each
event added around it gets `<that id>.<n>`. `source_id()` maps any id back to the logged
event it came from.

With `beta=True` (a client that sent `OpenAI-Beta: realtime=v1`) the output events take
their beta names (`response.audio.delta`, ...) and items are `conversation.item.created`.
"""

from __future__ import annotations

from typing import Any

from sessions.events import (
    ConversationItem,
    ConversationItemCreated,
    Event,
    InputTranscriptionCompleted,
    OutputAudioTranscriptDelta,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
)

from ..server_events import item_object, transcription_usage

Message = dict[str, Any]

RATE_LIMITS = [
    {"name": "requests", "limit": 10_000, "remaining": 9_999, "reset_seconds": 60.0},
    {"name": "tokens", "limit": 1_000_000, "remaining": 999_000, "reset_seconds": 60.0},
]
"""Static and generous: Parley's limit is its session cap, refused at connect time."""

BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}

AFTER_AUDIO = frozenset(
    {
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        *(BETA_NAMES[name] for name in BETA_NAMES if name.endswith(".done")),
    }
)
"""What ends a response: never sent ahead of that response's audio."""


def source_id(event_id: str) -> str:
    """The logged session event an outgoing event id belongs to."""
    return event_id.split("~", 1)[0].split(".", 1)[0]


class GAExpander:
    def __init__(self, *, beta: bool = False) -> None:
        self.beta = beta
        self._response_id: str | None = None
        self._item: ConversationItem | None = None
        self._text: list[str] = []
        self._user_audio_ms: dict[str, int] = {}
        """Item id -> audio length, for user audio items awaiting their transcript."""

    def name(self, event_type: str) -> str:
        """An event type as this connection spells it."""
        return BETA_NAMES.get(event_type, event_type) if self.beta else event_type

    def expand(self, event: Event, wire: Message) -> list[Message]:
        """`wire` (the event's own GA JSON) with the events that go around it, in order."""
        match event:
            case ResponseCreated():
                self._response_id, self._item, self._text = event.response_id, None, []
                rate_limits = {"type": "rate_limits.updated", "rate_limits": RATE_LIMITS}
                return self._ids(event, [wire, rate_limits], wire)
            case ConversationItemCreated():
                if event.item.role == "user" and event.item.has_audio:
                    self._user_audio_ms[event.item.id] = event.item.audio_ms
                return self._item_created(event, wire)
            case InputTranscriptionCompleted():
                # 0 s only when this connection never saw the item created (a resume
                # whose replay starts between the two): the SDK requires a usage.
                audio_ms = self._user_audio_ms.pop(event.item_id, 0)
                wire = {**wire, "usage": transcription_usage(audio_ms)}
                return self._ids(event, [wire], wire)
            case OutputAudioTranscriptDelta() | OutputTextDelta():
                if self._item is not None and event.item_id == self._item.id:
                    self._text.append(event.delta)
                return self._ids(event, [wire], wire)
            case ResponseDone():
                return self._response_done(event, wire)
            case _:
                return self._ids(event, [wire], wire)

    def _item_created(self, event: ConversationItemCreated, wire: Message) -> list[Message]:
        item = event.item
        wire = {**wire, "type": "conversation.item.added"}
        if item.role != "assistant" or self._response_id is None or self._item is not None:
            done = {"type": "conversation.item.done", **_without_type(wire)}
            return self._ids(event, [wire] if self.beta else [wire, done], wire)
        self._item = item
        announced = item_object(item) | {"content": [], "status": "in_progress"}
        wire["item"] = announced
        added = {
            "type": "response.output_item.added",
            "response_id": self._response_id,
            "output_index": 0,
            "item": announced,
        }
        part = {
            "type": "response.content_part.added",
            **self._where(),
            "part": _part(item, ""),
        }
        return self._ids(event, [added, wire, part], wire)

    def _response_done(self, event: ResponseDone, wire: Message) -> list[Message]:
        item = self._item
        self._response_id, self._item = None, None
        if item is None or event.item is None or event.item.id != item.id:
            return self._ids(event, [wire], wire)
        text, final = "".join(self._text), event.item
        where = self._where(event.response_id, item.id)
        group: list[Message] = []
        if item.has_audio:
            group.append({"type": "response.output_audio.done", **where})
            group.append(
                {"type": "response.output_audio_transcript.done", **where, "transcript": text}
            )
        else:
            group.append({"type": "response.output_text.done", **where, "text": text})
        group.append({"type": "response.content_part.done", **where, "part": _part(item, text)})
        item_json = item_object(final)
        group.append(
            {
                "type": "response.output_item.done",
                "response_id": event.response_id,
                "output_index": 0,
                "item": item_json,
            }
        )
        if not self.beta:
            group.append({"type": "conversation.item.done", "item": item_json})
        group.append(wire)
        return self._ids(event, group, wire)

    def _where(self, response_id: str | None = None, item_id: str | None = None) -> Message:
        assert self._item is not None or item_id is not None
        return {
            "response_id": response_id or self._response_id,
            "item_id": item_id or (self._item.id if self._item else None),
            "output_index": 0,
            "content_index": 0,
        }

    def _ids(self, event: Event, group: list[Message], own: Message) -> list[Message]:
        """The source keeps its id; the others get `<id>.<n>`. Types take this
        connection's spelling."""
        out: list[Message] = []
        n = 0
        for message in group:
            if message is own:
                event_id = event.event_id
            else:
                n += 1
                event_id = f"{event.event_id}.{n}"
            body = _without_type(message)
            body.pop("event_id", None)
            out.append({"type": self.name(message["type"]), "event_id": event_id, **body})
        return out


def _without_type(message: Message) -> Message:
    return {k: v for k, v in message.items() if k != "type"}


def _part(item: ConversationItem, text: str) -> Message:
    if item.has_audio:
        return {"type": "audio", "transcript": text}
    return {"type": "text", "text": text}
