"""GPT-Live's message mapping, whatever carries it: session events -> server events, client
events -> the session.

GPT-Live runs over a WebSocket (live_connection.py) and over WebRTC (the `oai-events` data
channel of realtime/webrtc/live_call.py). The two differ in their lifecycle and in where the
audio goes (base64 messages on the socket; the media track on a call), not in the events:
this is the one mapping both use, so a transcript, an acknowledgement or an error reads the
same on either.

- in: `session.input_audio.mute` / `.unmute` (acknowledged; the transport replaces the
  microphone's audio by silence while `muted`), `session.instructions.append` and
  `session.thinking.append` (developer notes and silent context: each a system note in the
  conversation, which asks for no speech; acknowledged with its place on the timeline),
  `session.commentary.append` (a note the assistant says at its next turn:
  live_commentary.py), `session.update` (the delegation only, answered with
  `session.updated`), the Responses delegation's `response.item.create` and
  `response.create` (live_delegation.py), `session.close`. `session.input_audio.append` is
  the transport's (`append`): a transport without one (WebRTC: the microphone is the track)
  refuses it. Anything else gets an `error` naming the event (`client_event_id`) and the
  session goes on.
- out: `session.input_transcript.delta` / `session.output_transcript.delta` with
  `start_ms` / `end_ms` on the session's timeline (ms since it started: the user's speech
  where the turn detector heard it, the assistant's text where its audio was reached), the
  delegation's events, `error`, and `session.closed` with the reason and the usage. Audio
  is the transport's.

The mapping sends what it says of its own (acknowledgements, errors) through `post`, and
the errors about the client's messages share one throttle (a few a second, then one summary).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from sessions import ConfigError, Session
from sessions.events import (
    ConversationItem,
    ErrorEvent,
    Event,
    FunctionCallArgumentsDone,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    OutputAudioTranscriptDelta,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SpeechStarted,
    SpeechStopped,
    new_id,
)

from ..error_throttle import ErrorThrottle
from ..websocket.connection import CLIENT_CLOSED
from ..websocket.sender import Message
from .live_commentary import MAX_CHARS, Commentary, CommentaryFull
from .live_config import (
    LiveConfigError,
    LiveDelegation,
    LiveSessionConfig,
    check_delegation,
    delegated_tools,
    resolved,
)
from .live_delegation import ResponsesBackend
from .live_errors import live_error

ERROR_LIMIT = 20
"""`error` events about the client's own messages per second; the rest are summarised."""

CLOSE_REQUESTED = "close_requested"

CLOSED_REASONS = {
    CLOSE_REQUESTED: "close_requested",
    CLIENT_CLOSED: "close_requested",
    "max_duration": "expired",
    "expired": "expired",
}
"""Parley's reason for a session's end -> GPT-Live's; any other is `connection_lost`."""

AppendAudio = Callable[[dict[str, Any], str | None], Awaitable[None]]
"""A transport's `session.input_audio.append`: (the event, its client event id)."""


class LiveMapping:
    def __init__(
        self,
        live: LiveSessionConfig,
        post: Callable[[Message], None],
        *,
        append: AppendAudio | None = None,
        audio_format: bool = True,
    ) -> None:
        self.live = live
        self.post = post
        """Where a message of the mapping's own goes (the transport's ordered output)."""
        self.session: Session | None = None
        self.muted = False
        self.started_at = time.monotonic()
        self.expires_at = int(time.time()) + 3600
        self._append = append
        self._audio_format = audio_format
        """Whether the session's audio format is a setting (a WebSocket's) to report."""
        self._errors = ErrorThrottle(self._summarise, limit=ERROR_LIMIT)
        self._speech: dict[str, tuple[int, int]] = {}
        """item id -> where the user's speech lies on the timeline (ms), as heard."""
        self._heard: dict[str, str] = {}
        """item id -> transcript text already sent as deltas."""
        self._commentary = Commentary()
        self._backend = ResponsesBackend()

    def bind(self, session: Session) -> None:
        """The session starts now: the timeline's zero."""
        self.session = session
        self.started_at = time.monotonic()
        self.expires_at = int(time.time() + session.limits.max_lifetime_s)

    def started(self, client_event_id: str | None) -> Message:
        assert self.session is not None
        message: Message = {
            "type": "session.started",
            "event_id": new_id("event"),
            "session": self.resolved(),
        }
        if client_event_id is not None:
            message["client_event_id"] = client_event_id
        return message

    def resolved(self) -> dict[str, Any]:
        """The session as served, for `session.started` / `.updated` / `.closed`."""
        assert self.session is not None
        return resolved(
            self.live, self.session.session_id, self.expires_at, audio_format=self._audio_format
        )

    def now_ms(self) -> int:
        return round((time.monotonic() - self.started_at) * 1000)

    async def speak_commentary(self) -> None:
        """The task that speaks commentary when it may; the transport owns it."""
        await self._commentary.run()

    def close(self) -> None:
        """No more output of the mapping's own (a summary of throttled errors). Idempotent."""
        self._errors.close()

    # --- out ------------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """What a session event tells the commentary (when it may speak)."""
        self._commentary.observe(event)

    def messages(self, event: Event) -> list[tuple[Message, bool]]:
        """A session event's GPT-Live messages, each with its `after_audio` flag (none of
        them waits for the audio: GPT-Live's transcripts run alongside it)."""
        if isinstance(event, ResponseCreated | FunctionCallArgumentsDone | ResponseDone):
            return [(m, False) for m in self._backend.messages(event, self.now_ms())]
        if isinstance(event, SpeechStarted):
            self._speech[event.item_id] = (event.audio_start_ms, event.audio_start_ms)
        elif isinstance(event, SpeechStopped):
            start, _ = self._speech.get(event.item_id, (event.audio_end_ms, 0))
            self._speech[event.item_id] = (start, event.audio_end_ms)
        elif isinstance(event, InputTranscriptionDelta):
            return [(self._input_delta(event.item_id, event.delta), False)]
        elif isinstance(event, InputTranscriptionCompleted):
            # what the deltas have not said yet (all of it when the recogniser sent none)
            sent = self._heard.get(event.item_id, "")
            rest = event.transcript[len(sent) :] if event.transcript.startswith(sent) else ""
            messages = [(self._input_delta(event.item_id, rest), False)] if rest else []
            self._heard.pop(event.item_id, None)
            self._speech.pop(event.item_id, None)
            return messages
        elif isinstance(event, OutputAudioTranscriptDelta):
            at = self.now_ms()
            return [(self._delta("session.output_transcript.delta", event.delta, at, at), False)]
        elif isinstance(event, ErrorEvent):
            return [
                (
                    live_error(
                        event.code,
                        event.message,
                        event.client_event_id,
                        error_type=event.error_type,
                        param=event.param,
                    ),
                    False,
                )
            ]
        elif isinstance(event, SessionClosed):
            return [(self._closed(event.reason), True)]
        return []

    def _input_delta(self, item_id: str, text: str) -> Message:
        self._heard[item_id] = self._heard.get(item_id, "") + text
        start, end = self._speech.get(item_id, (self.now_ms(), self.now_ms()))
        return self._delta("session.input_transcript.delta", text, start, max(start, end))

    @staticmethod
    def _delta(kind: str, text: str, start_ms: int, end_ms: int) -> Message:
        return {
            "type": kind,
            "event_id": new_id("event"),
            "delta": text,
            "start_ms": start_ms,
            "end_ms": end_ms,
        }

    def _closed(self, reason: str) -> Message:
        assert self.session is not None
        return {
            "type": "session.closed",
            "event_id": new_id("event"),
            "reason": CLOSED_REASONS.get(reason, "connection_lost"),
            "session": self.resolved(),
            "usage": {"seconds": float(int(time.monotonic() - self.started_at))},
        }

    def _summarise(self, count: int, first: str) -> None:
        self.post(
            live_error(
                "errors_suppressed", f"{count} more errors left out this second; the first: {first}"
            )
        )

    # --- in -------------------------------------------------------------------------------

    def parse(self, raw: str | bytes) -> tuple[str, dict[str, Any], str | None] | None:
        """A client message as (its type, the event, its `event_id`); None once the client
        was told it is not an event."""
        try:
            event = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            self.refuse("invalid_json", "the message is not JSON", None)
            return None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self.refuse("invalid_event", "an event is a JSON object with a `type`", None)
            return None
        client_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        return event["type"], event, client_id

    async def handle(self, raw: str | bytes) -> bool:
        """Apply one client message; True when the client asked to close the session."""
        parsed = self.parse(raw)
        return parsed is not None and await self.apply(*parsed)

    async def apply(self, kind: str, event: dict[str, Any], client_id: str | None) -> bool:
        """Apply one parsed client event; True when it asks to close the session."""
        session = self.session
        assert session is not None
        if kind == "session.input_audio.append":
            if self._append is None:
                why = "audio comes on the media track here, not in events"
                self.refuse("unsupported_event", why, client_id, "type")
            else:
                await self._append(event, client_id)
        elif kind in ("session.input_audio.mute", "session.input_audio.unmute"):
            self.muted = kind.endswith(".mute")
            self._ack(
                "session.input_audio.muted" if self.muted else "session.input_audio.unmuted",
                client_id,
            )
        elif kind in ("session.instructions.append", "session.thinking.append"):
            # Both join the conversation as notes the model reads (instructions stay in
            # the history; thinking is silent context); neither asks for speech.
            text = self._text(event, "content", client_id)
            if text is not None:
                await session.add_item(ConversationItem(role="system", text=text))
                at = self.now_ms()
                done = kind.replace(".append", ".appended")
                self._ack(done, client_id, start_ms=at, end_ms=at)
        elif kind == "session.commentary.append":
            await self._commentary_append(event, client_id)
        elif kind == "session.update":
            await self._update(event, client_id)
        elif kind == "response.item.create":
            await self._item_create(event, client_id)
        elif kind == "response.create":
            await self._response_create(client_id)
        elif kind == "session.close":
            return True
        elif kind == "session.start":
            self.refuse("session_already_started", "the session has started already", client_id)
        else:
            self.refuse(
                "unsupported_event",
                f"{kind!r} is not served here (GPT-Live on Parley: audio appends, mute, "
                "instructions, thinking, commentary, session.update, the Responses "
                "delegation's response.item.create and response.create, and close)",
                client_id,
                "type",
            )
        return False

    async def _commentary_append(self, event: dict[str, Any], client_id: str | None) -> None:
        if "delegation_id" not in event:
            why = "`delegation_id` is required (null for commentary of the session's own)"
            self.refuse("missing_required_parameter", why, client_id, "delegation_id")
            return
        delegation_id = event["delegation_id"]
        if delegation_id is not None:
            delegation = self.live.delegation
            why = (
                "a delegation id is not accepted with responses delegation"
                if delegation is not None and delegation.type == "responses"
                else f"no client delegation {delegation_id!r} exists in this session"
            )
            self.refuse("invalid_value", why, client_id, "delegation_id")
            return
        text = self._text(event, "content", client_id)
        if text is None:
            return
        if len(text) > MAX_CHARS:
            self.refuse(
                "invalid_value",
                f"`content` is limited to 500 tokens (about {MAX_CHARS} characters)",
                client_id,
                "content",
            )
            return
        assert self.session is not None
        try:
            await self._commentary.append(self.session, text)
        except CommentaryFull as exc:
            self.refuse("commentary_backlog", str(exc), client_id, "content")
            return
        at = self.now_ms()
        self._ack("session.commentary.appended", client_id, start_ms=at, end_ms=at)

    async def _update(self, event: dict[str, Any], client_id: str | None) -> None:
        """Only the delegation settings change after start (GPT-Live's rule)."""
        body = event.get("session")
        if not isinstance(body, dict) or set(body) - {"delegation"}:
            extra = sorted(set(body) - {"delegation"}) if isinstance(body, dict) else []
            text = "session.update changes only `delegation` once the session has started"
            param = f"session.{extra[0]}" if extra else "session"
            self.refuse("invalid_value", text, client_id, param)
            return
        try:
            delegation = LiveDelegation.model_validate(body.get("delegation") or {"type": "client"})
            check_delegation(delegation)
        except ValidationError as exc:
            self.refuse(
                "invalid_value", str(exc.errors()[0]["msg"]), client_id, "session.delegation"
            )
            return
        except LiveConfigError as exc:
            self.refuse(exc.code, str(exc), client_id, exc.param)
            return
        assert self.session is not None
        try:
            await self.session.update(delegated_tools(delegation))
        except ConfigError as exc:  # a tool Parley's session cannot take
            self.refuse("invalid_value", str(exc), client_id, "session.delegation.responses")
            return
        except Exception as exc:  # the session's own trouble: its typed error, as elsewhere
            self.session.report_error(exc, client_id)
            return
        self.live = self.live.model_copy(update={"delegation": delegation})
        message: Message = {
            "type": "session.updated",
            "event_id": new_id("event"),
            "session": self.resolved(),
        }
        if client_id is not None:
            message["client_event_id"] = client_id
        self.post(message)

    def _responses_delegation(self, client_id: str | None) -> bool:
        delegation = self.live.delegation
        if delegation is not None and delegation.type == "responses":
            return True
        why = "this event requires responses delegation (the session's is client delegation)"
        self.refuse("invalid_request", why, client_id, "type")
        return False

    async def _item_create(self, event: dict[str, Any], client_id: str | None) -> None:
        """A function call's output for Parley's model (the Responses backend), or a note:
        a message item joins the conversation as text, nothing is said until a
        `response.create`."""
        if not self._responses_delegation(client_id):
            return
        item = event.get("item")
        kinds = ("function_call_output", "message")
        if not isinstance(item, dict) or item.get("type") not in kinds:
            why = "`item` is a function_call_output or a message"
            self.refuse("invalid_value", why, client_id, "item.type")
            return
        assert self.session is not None
        if item["type"] == "message":
            text = _message_text(item.get("content"))
            role = item.get("role")
            if text is None or role not in ("user", "developer", "system"):
                why = "a message item has a role (user, developer or system) and text content"
                self.refuse("invalid_value", why, client_id, "item")
                return
            await self.session.add_item(
                ConversationItem(role="user" if role == "user" else "system", text=text)
            )
            return
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not isinstance(output, str):
            why = "a function_call_output has a `call_id` and an `output` (text)"
            self.refuse("missing_required_parameter", why, client_id, "item.call_id")
            return
        if self._backend.output(call_id) is None:
            why = f"no function call {call_id!r} is waiting for its output"
            self.refuse("invalid_value", why, client_id, "item.call_id")
            return
        await self.session.add_item(
            ConversationItem(role="user", type="function_call_output", call_id=call_id, text=output)
        )

    async def _response_create(self, client_id: str | None) -> None:
        """Go on with the delegated work: Parley's model answers with the outputs given."""
        if not self._responses_delegation(client_id):
            return
        assert self.session is not None
        if waiting := self._backend.waiting():
            why = f"{waiting} function call(s) still wait for their outputs; send each first"
            self.refuse("invalid_request", why, client_id, "type")
            return
        self._backend.continue_work()
        try:
            await self.session.create_response()
        except Exception as exc:
            self._backend.forget_continuation()
            self.session.report_error(exc, client_id)

    def _text(self, event: dict[str, Any], field: str, client_id: str | None) -> str | None:
        text = event.get(field)
        if not isinstance(text, str) or not text.strip():
            self.refuse("invalid_value", f"`{field}` must be non-empty text", client_id, field)
            return None
        return text

    def _ack(self, kind: str, client_id: str | None, **timeline: int) -> None:
        message: Message = {"type": kind, "event_id": new_id("event"), **timeline}
        if client_id is not None:
            message["client_event_id"] = client_id
        self.post(message)

    def refuse(self, code: str, text: str, client_id: str | None, param: str | None = None) -> None:
        if self._errors.admit(code, text):
            self.post(live_error(code, text, client_id, param=param))


def _message_text(content: Any) -> str | None:
    """The text of a Responses message item's content: a string, or text parts."""
    if isinstance(content, str):
        return content if content.strip() else None
    if not isinstance(content, list):
        return None
    texts = [
        part["text"]
        for part in content
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]
    text = "".join(texts)
    return text if text.strip() else None
