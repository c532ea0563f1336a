"""The full GA event sequence around the session's events, for one OpenAI connection.

Shared by every OpenAI transport: the WebSocket, the WebRTC data channel and a sideband.

The session emits what it knows: a response was created, an item was created, deltas, the
response is done. An OpenAI Realtime (GA) client expects more: the output item and its
content part announced and finished, the transcript or text in full at the end,
`conversation.item.added` / `.done`, and `rate_limits.updated`. `GAExpander` adds them.
It keeps a little state per connection (the response in progress, its output items in
`response.output` order with the text of each so far, the length of user audio awaiting
its transcript), so each connection has its own. A function call is an output item of its
own: announced with its first arguments, done with `response.function_call_arguments.done`.
An out-of-band response's items are output items but never conversation items.
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

from dataclasses import dataclass, field
from typing import Any

from sessions.events import (
    ConversationItem,
    ConversationItemCreated,
    Event,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    InputTranscriptionCompleted,
    OutputAudioTranscriptDelta,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
)
from sessions.mcp_events import (
    McpCallArgumentsDelta,
    McpCallArgumentsDone,
    McpCallCompleted,
    McpCallFailed,
    McpCallInProgress,
)

from .server_events import item_object, transcription_usage

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


@dataclass(slots=True)
class _Output:
    """One output item of the response in progress, at its place in `response.output`."""

    index: int
    item: ConversationItem
    text: list[str] = field(default_factory=list)
    done: bool = False


class GAExpander:
    def __init__(self, *, beta: bool = False) -> None:
        self.beta = beta
        self._response_id: str | None = None
        self._in_conversation = True
        self._outputs: dict[str, _Output] = {}
        """Item id -> the response's output items so far, in output order."""
        self._user_audio_ms: dict[str, int] = {}
        """Item id -> audio length, for user audio items awaiting their transcript."""

    def name(self, event_type: str) -> str:
        """An event type as this connection spells it."""
        return BETA_NAMES.get(event_type, event_type) if self.beta else event_type

    def expand(self, event: Event, wire: Message) -> list[Message]:
        """`wire` (the event's own GA JSON) with the events that go around it, in order."""
        match event:
            case ResponseCreated():
                self._response_id, self._outputs = event.response_id, {}
                self._in_conversation = event.in_conversation
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
                output = self._outputs.get(event.item_id)
                if output is not None:
                    output.text.append(event.delta)
                    wire = {**wire, "output_index": output.index}
                return self._ids(event, [wire], wire)
            case FunctionCallArgumentsDelta():
                return self._ids(event, [self._indexed(wire, event.item_id)], None)
            case FunctionCallArgumentsDone() | McpCallCompleted() | McpCallFailed():
                return self._call_done(event, wire)
            case McpCallArgumentsDelta() | McpCallArgumentsDone() | McpCallInProgress():
                return self._ids(event, [self._indexed(wire, event.item_id)], None)
            case ResponseDone():
                return self._response_done(event, wire)
            case _:
                return self._ids(event, [wire], wire)

    def _indexed(self, wire: Message, item_id: str) -> Message:
        output = self._outputs.get(item_id)
        return {**wire, "output_index": output.index} if output is not None else wire

    def _item_created(self, event: ConversationItemCreated, wire: Message) -> list[Message]:
        item = event.item
        wire = {**wire, "type": "conversation.item.added"}
        if (
            event.response_id is None
            or event.response_id != self._response_id
            or item.id in self._outputs
        ):
            done = {"type": "conversation.item.done", **_without_type(wire)}
            return self._ids(event, [wire] if self.beta else [wire, done], wire)
        output = self._outputs[item.id] = _Output(len(self._outputs), item)
        announced = item_object(item) | {"status": "in_progress"}
        if item.type == "message":
            announced["content"] = []
        wire["item"] = announced
        added = {
            "type": "response.output_item.added",
            "response_id": self._response_id,
            "output_index": output.index,
            "item": announced,
        }
        group = [added, wire] if self._in_conversation else [added]
        if item.type == "message":
            part = {
                "type": "response.content_part.added",
                **self._where(output),
                "part": _part(item, ""),
            }
            group.append(part)
        return self._ids(event, group, wire if self._in_conversation else added)

    def _item_done(self, output: _Output, item: ConversationItem) -> list[Message]:
        """`response.output_item.done`, and `conversation.item.done` for an item that
        joined the conversation."""
        output.done = True
        item_json = item_object(item)
        group: list[Message] = [
            {
                "type": "response.output_item.done",
                "response_id": self._response_id,
                "output_index": output.index,
                "item": item_json,
            }
        ]
        if self._in_conversation and not self.beta:
            group.append({"type": "conversation.item.done", "item": item_json})
        return group

    def _call_done(
        self, event: FunctionCallArgumentsDone | McpCallCompleted | McpCallFailed, wire: Message
    ) -> list[Message]:
        output = self._outputs.get(event.item.id)
        if output is None:
            return self._ids(event, [wire], wire)
        wire = self._indexed(wire, event.item.id)
        return self._ids(event, [wire, *self._item_done(output, event.item)], wire)

    def _response_done(self, event: ResponseDone, wire: Message) -> list[Message]:
        group: list[Message] = []
        message = self._outputs.get(event.item.id) if event.item is not None else None
        if message is not None and event.item is not None and not message.done:
            item, text = message.item, "".join(message.text)
            where = self._where(message)
            if item.has_audio:
                group.append({"type": "response.output_audio.done", **where})
                group.append(
                    {"type": "response.output_audio_transcript.done", **where, "transcript": text}
                )
            else:
                group.append({"type": "response.output_text.done", **where, "text": text})
            group.append({"type": "response.content_part.done", **where, "part": _part(item, text)})
            group += self._item_done(message, event.item)
        for call in event.calls:  # calls cut off mid-arguments end here, incomplete
            output = self._outputs.get(call.id)
            if output is not None and not output.done:
                group += self._item_done(output, call)
        self._response_id, self._outputs = None, {}
        group.append(wire)
        return self._ids(event, group, wire)

    def _where(self, output: _Output) -> Message:
        return {
            "response_id": self._response_id,
            "item_id": output.item.id,
            "output_index": output.index,
            "content_index": 0,
        }

    def _ids(self, event: Event, group: list[Message], own: Message | None) -> list[Message]:
        """The source keeps its id (`own`: the message that is the event itself); the
        others get `<id>.<n>`. Types take this connection's spelling."""
        out: list[Message] = []
        n = 0
        for message in group:
            if message is own or (own is None and message is group[0]):
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
