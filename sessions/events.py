"""The session's event vocabulary, modelled on OpenAI Realtime's server events.

The session core emits these dataclasses; transports serialise them to their own wire
format. `type` is the GA event name. Events a barge-in may discard (audio deltas) say so
with `droppable`, so a transport that falls behind knows what it may coalesce or drop.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pipeline.types import Logprobs

from .config import SessionConfig

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ItemType = Literal[
    "message",
    "function_call",
    "function_call_output",
    "mcp_list_tools",
    "mcp_call",
    "mcp_approval_request",
    "mcp_approval_response",
]
ResponseStatus = Literal["completed", "cancelled", "failed"]


def new_id(prefix: str) -> str:
    """Short random ids in OpenAI's style: `evt_…`, `item_…`, `resp_…`."""
    return f"{prefix}_{secrets.token_hex(10)}"


@dataclass(slots=True, kw_only=True)
class ConversationItem:
    """One item of the conversation: a message (a user turn, an assistant answer, a system
    note), or a function call the model made and the output the client sent back.

    A `function_call` has role assistant, the tool's `name`, the `call_id` and its JSON
    `arguments`; a `function_call_output` has role user, the same `call_id`, and the
    output as `text`.
    """

    id: str = field(default_factory=lambda: new_id("item"))
    role: Literal["user", "assistant", "system"]
    status: ItemStatus = "completed"
    text: str = ""
    """A typed message, the user's transcript, the assistant's (possibly truncated) text,
    or a function call's output."""
    has_audio: bool = False
    audio_ms: int = 0
    """Duration of the item's audio: the user's turn, or the assistant audio actually played."""
    type: ItemType = "message"
    name: str = ""
    call_id: str = ""
    arguments: str = ""
    server_label: str = ""
    """The MCP server of an `mcp_*` item (mcp_events.py says how each uses the fields)."""
    approval_request_id: str = ""
    approve: bool = False
    error: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    type: ClassVar[str]
    droppable: ClassVar[bool] = False
    event_id: str = field(default_factory=lambda: new_id("evt"))


# --- session lifecycle ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionCreated(Event):
    type: ClassVar[str] = "session.created"
    session_id: str
    config: SessionConfig
    resume_token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdated(Event):
    type: ClassVar[str] = "session.updated"
    session_id: str
    config: SessionConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionStateChanged(Event):
    """Parley's own: every state transition, with why it happened."""

    type: ClassVar[str] = "session.state_changed"
    previous: str
    state: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionExpiring(Event):
    """Parley's own: the session reaches its maximum lifetime in `seconds_left`."""

    type: ClassVar[str] = "session.expiring"
    seconds_left: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClosed(Event):
    """Parley's own goodbye: the last event of every session."""

    type: ClassVar[str] = "session.closed"
    reason: str


# --- input audio ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStarted(Event):
    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStopped(Event):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioBufferCommitted(Event):
    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioBufferCleared(Event):
    type: ClassVar[str] = "input_audio_buffer.cleared"


@dataclass(frozen=True, slots=True, kw_only=True)
class DtmfReceived(Event):
    """A keypad digit the caller pressed (a phone call's RFC 4733 telephone-event)."""

    type: ClassVar[str] = "input_audio_buffer.dtmf_event_received"
    digit: str
    received_at: int
    """Unix seconds."""


# --- conversation --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemCreated(Event):
    type: ClassVar[str] = "conversation.item.created"
    item: ConversationItem
    previous_item_id: str | None
    response_id: str | None = None
    """The response whose output the item is (None: a client's item, or a user turn)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemTruncated(Event):
    type: ClassVar[str] = "conversation.item.truncated"
    item_id: str
    content_index: int = 0
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemDeleted(Event):
    type: ClassVar[str] = "conversation.item.deleted"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemRetrieved(Event):
    """conversation.item.retrieve's answer: the item as the conversation holds it now."""

    type: ClassVar[str] = "conversation.item.retrieved"
    item: ConversationItem


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioTimeoutTriggered(Event):
    """No speech for `idle_timeout_ms` after an answer: the silence becomes a turn."""

    type: ClassVar[str] = "input_audio_buffer.timeout_triggered"
    item_id: str
    audio_start_ms: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionDelta(Event):
    """Part of the transcript of a user's audio item, as the recogniser produces it."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    item_id: str
    delta: str
    logprobs: Logprobs | None = None
    """The tokens of `delta` with their log-probabilities, for a session that includes
    them (`item.input_audio_transcription.logprobs`) when the recogniser has them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionFailed(Event):
    """The user's audio item got no transcript: the answer failed before the recogniser
    finished."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.failed"
    item_id: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionCompleted(Event):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    item_id: str
    transcript: str
    logprobs: Logprobs | None = None
    """The tokens of `transcript` with their log-probabilities (as the delta's)."""


# --- responses -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreated(Event):
    type: ClassVar[str] = "response.created"
    response_id: str
    metadata: dict[str, str] | None = None
    """What the client's `response.create` carried as `response.metadata`, echoed."""
    in_conversation: bool = True
    """False for an out-of-band response (`conversation: "none"`)."""
    audio_output: bool = True
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputTextDelta(Event):
    type: ClassVar[str] = "response.output_text.delta"
    response_id: str
    item_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioTranscriptDelta(Event):
    type: ClassVar[str] = "response.output_audio_transcript.delta"
    response_id: str
    item_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDelta(Event):
    """The next piece of the JSON arguments of a function call the model is making."""

    type: ClassVar[str] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    call_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDone(Event):
    """The model's function call is complete: the client runs it and sends its output."""

    type: ClassVar[str] = "response.function_call_arguments.done"
    response_id: str
    item: ConversationItem


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioDelta(Event):
    """PCM16 mono at `sample_rate`. Droppable: a barge-in or a slow client may discard it."""

    type: ClassVar[str] = "response.output_audio.delta"
    droppable: ClassVar[bool] = True
    response_id: str
    item_id: str
    pcm: bytes
    sample_rate: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseUsage:
    """Counts and timings of one response, reported in response.done."""

    input_audio_ms: int = 0
    input_text_chars: int = 0
    """The prompt's words: instructions, history and the turn's text."""
    output_audio_ms: int = 0
    output_text_chars: int = 0
    first_text_ms: float | None = None
    """From the request to the first text delta."""
    first_audio_ms: float | None = None
    """From the request to the first audio chunk."""
    total_ms: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseDone(Event):
    type: ClassVar[str] = "response.done"
    response_id: str
    status: ResponseStatus
    reason: str = ""
    error_code: str = ""
    """A failed response's error code (`model_error`, `context_length_exceeded`, ...)."""
    item: ConversationItem | None = None
    """The answer's message item, if it said anything."""
    usage: ResponseUsage = field(default_factory=ResponseUsage)
    metadata: dict[str, str] | None = None
    calls: tuple[ConversationItem, ...] = ()
    """The function calls the model made, in order (after the message, if any)."""
    in_conversation: bool = True
    audio_output: bool = True
    max_output_tokens: int | None = None


CLIENT_ERRORS = {"context_length_exceeded": "invalid_request_error"}
"""A failed response's error type by its code, where the request and not the server is at
fault (the conversation is longer than the model's context and may not be cut); any other
code is a `server_error`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEvent(Event):
    """A problem the client should know about; the session goes on."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    error_type: str = "invalid_request_error"
    client_event_id: str | None = None
    param: str | None = None


def error_event(error: Exception, client_event_id: str | None = None) -> ErrorEvent:
    """The `error` event telling a client of `error` (a ParleyError's code, type and field,
    errors.py; any other exception is a server_error)."""
    return ErrorEvent(
        code=getattr(error, "code", "server_error"),
        message=str(error),
        error_type=getattr(error, "error_type", "server_error"),
        client_event_id=client_event_id,
        param=getattr(error, "field", None),
    )
