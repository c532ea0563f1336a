"""GPT-Live's message mapping, whatever carries the session's media.

A GPT-Live session has one primary transport (a WebSocket that also carries the audio, or
a SIP call whose audio is RTP) and any number of sidebands (live_sideband.py). What the
session says and what a controller may tell it are the same in every case, so the mapping
lives here, once, and each transport hosts a `LiveProtocol`:

- out: `messages(event)` turns a session event into GPT-Live server events (transcripts
  with `start_ms` / `end_ms` on the session's timeline, the Responses delegation's
  envelopes, `error`, and `session.closed` with its reason and usage, last);
- in: `handle(event)` applies one client event (instructions, thinking, commentary,
  mute, `session.update`, the delegation's items, `session.close`); the microphone's
  audio is the transport's own business and never comes here;
- delegation: `responses` with Parley's model as the backend (live_delegation.py), or
  `client`, where the model hands work to the app (live_client_delegation.py);
- the sidebands attached to the session get every message the primary is sent (but the
  audio), through `forward`.

The host gives it `send` (how one message reaches the primary connection and, through its
`forward`, the sidebands; None when the primary has no message channel, as a SIP call) and
`close` (what `session.close` does: end the transport, with `close_requested`), and owns
the task `run()` (commentary and acknowledgements said when they may) for the session's life.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import ValidationError

from sessions import ConfigError, Session
from sessions.events import (
    ConversationItem,
    ConversationItemCreated,
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
from ..transports.websocket.sender import Message
from .live_client_delegation import ClientDelegations
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
from .live_recording import LiveRecording

ERROR_LIMIT = 20
"""`error` events about the client's own messages per second; the rest are summarised."""

CLOSE_REQUESTED = "close_requested"
REMOTE_HANGUP = "remote_hangup"

CLOSED_REASONS = {
    CLOSE_REQUESTED: "close_requested",
    "client_closed": "close_requested",
    REMOTE_HANGUP: "remote_hangup",
    "max_duration": "expired",
    "expired": "expired",
}
"""Parley's reason for a session's end -> GPT-Live's; any other is `connection_lost`."""

SESSION_ENDED = "session_ended"

TRANSCRIBED = 64
"""Items remembered as transcribed whole (a later recognition of one is not said twice)."""


class Sideband(Protocol):
    """What the protocol needs of an attached sideband (live_sideband.LiveSideband)."""

    def forward(self, message: Message) -> None: ...

    def finish(self, reason: str) -> None: ...


class LiveProtocol:
    def __init__(
        self,
        live: LiveSessionConfig,
        *,
        send: Callable[[Message], None] | None,
        close: Callable[[str], None],
        media_format: bool = True,
    ) -> None:
        """`media_format`: whether the session's `audio.format` is GPT-Live's to state
        (a WebSocket's); SIP negotiates its own, and the snapshot leaves it out."""
        self.live = live
        self.session: Session | None = None
        self.muted = False
        """While muted the microphone's audio is replaced by silence (the transport's)."""
        self.started_at = time.monotonic()
        self.expires_at = int(time.time()) + 3600
        self.ended = False
        self._send = send
        self._close = close
        self._media_format = media_format
        self._errors = ErrorThrottle(self._summarise, limit=ERROR_LIMIT)
        self._speech: dict[str, tuple[int, int]] = {}
        """item id -> where the user's speech lies on the timeline (ms), as heard."""
        self._heard: dict[str, str] = {}
        self._transcribed: collections.deque[str] = collections.deque(maxlen=TRANSCRIBED)
        """The last items whose transcript was said whole."""
        """item id -> transcript text already sent as deltas."""
        self.commentary = Commentary()
        self.delegations = ClientDelegations()
        self._backend = ResponsesBackend()
        self._sidebands: list[Sideband] = []
        self.recording: LiveRecording | None = None
        """Both sides' audio, for a session with `store: true` (live_store.py)."""
        """Controllers attached to this session: each is sent what the primary is sent,
        but the audio."""

    def bind(self, session: Session) -> None:
        self.session = session
        self.delegations.session = session
        self._delegation_changed()
        self.started_at = time.monotonic()
        self.expires_at = int(time.time() + session.limits.max_lifetime_s)

    async def run(self) -> None:
        """Say commentary and delegations' acknowledgements when they may be said; a task
        of the host's, cancelled when the session ends."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.commentary.run(), name="live:commentary")
            tasks.create_task(self.delegations.run(), name="live:delegations")

    @property
    def client_delegation(self) -> bool:
        """The model delegates to the app (asked for explicitly: live_client_delegation.py)."""
        delegation = self.live.delegation
        return delegation is not None and delegation.type == "client"

    def _delegation_changed(self) -> None:
        delegation = self.live.delegation
        delay = delegation.acknowledgement_delay_ms if delegation is not None else None
        self.delegations.delay_ms = delay or 0

    # --- sidebands ----------------------------------------------------------------------

    def attach_sideband(self, sideband: Sideband) -> bool:
        """Send `sideband` the session's messages from now on; False once it has ended."""
        if self.ended:
            return False
        self._sidebands.append(sideband)
        return True

    def detach_sideband(self, sideband: Sideband) -> None:
        if sideband in self._sidebands:
            self._sidebands.remove(sideband)

    def forward(self, message: Message) -> None:
        """One message the primary was sent, to every sideband."""
        for sideband in list(self._sidebands):
            sideband.forward(message)

    def end(self) -> None:
        """The session has ended: so have its sidebands (after its `session.closed`, when
        it got that far). Idempotent."""
        self.ended = True
        sidebands, self._sidebands = self._sidebands, []
        for sideband in sidebands:
            sideband.finish(SESSION_ENDED)
        self._errors.close()

    def hang_up(self) -> None:
        """The app's hangup (`POST /v1/live/sessions/{id}/hangup`): the session ends as its
        `session.close` would end it (`close_requested`)."""
        self._close(CLOSE_REQUESTED)

    def post(self, message: Message) -> None:
        """A message of the protocol's own (an acknowledgement, an error)."""
        if self._send is not None:
            self._send(message)  # the host forwards it to the sidebands too
        else:
            self.forward(message)

    # --- out ------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The `session` of `session.started` / `.updated` / `.closed`."""
        assert self.session is not None
        return resolved(
            self.live, self.session.session_id, self.expires_at, media_format=self._media_format
        )

    def started(self, client_event_id: str | None) -> Message:
        message: Message = {
            "type": "session.started",
            "event_id": new_id("event"),
            "session": self.snapshot(),
        }
        if client_event_id is not None:
            message["client_event_id"] = client_event_id
        return message

    def now_ms(self) -> int:
        return round((time.monotonic() - self.started_at) * 1000)

    def observe(self, event: Event) -> None:
        self.commentary.observe(event)

    def messages(self, event: Event) -> list[tuple[Message, bool]]:
        """The GPT-Live server events of one session event, each with its `after_audio`
        flag (`session.closed` never overtakes the audio before it)."""
        if isinstance(event, ConversationItemCreated) and event.response_id is not None:
            if self.client_delegation:  # a delegating call's start
                return [(m, False) for m in self.delegations.messages(event, self.now_ms())]
            return []
        if isinstance(event, ResponseCreated | FunctionCallArgumentsDone | ResponseDone):
            mapping = self.delegations if self.client_delegation else self._backend
            return [(m, False) for m in mapping.messages(event, self.now_ms())]
        if isinstance(event, SpeechStarted):
            self._speech[event.item_id] = (event.audio_start_ms, event.audio_start_ms)
        elif isinstance(event, SpeechStopped):
            start, _ = self._speech.get(event.item_id, (event.audio_end_ms, 0))
            self._speech[event.item_id] = (start, event.audio_end_ms)
        elif isinstance(event, InputTranscriptionDelta | InputTranscriptionCompleted):
            if event.item_id in self._transcribed:
                return []  # said whole already: a second recognition is not said again
            if isinstance(event, InputTranscriptionDelta):
                return [(self._input_delta(event.item_id, event.delta), False)]
            # what the deltas have not said yet (all of it when the recogniser sent none)
            sent = self._heard.get(event.item_id, "")
            rest = event.transcript[len(sent) :] if event.transcript.startswith(sent) else ""
            messages = [(self._input_delta(event.item_id, rest), False)] if rest else []
            self._heard.pop(event.item_id, None)
            self._speech.pop(event.item_id, None)
            self._transcribed.append(event.item_id)
            return messages
        elif isinstance(event, OutputAudioTranscriptDelta):
            at = self.now_ms()
            return [(self._delta("session.output_transcript.delta", event.delta, at, at), False)]
        elif isinstance(event, ErrorEvent):
            error = live_error(
                event.code,
                event.message,
                event.client_event_id,
                error_type=event.error_type,
                param=event.param,
            )
            return [(error, False)]
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
        return {
            "type": "session.closed",
            "event_id": new_id("event"),
            "reason": CLOSED_REASONS.get(reason, "connection_lost"),
            "session": self.snapshot(),
            "usage": {"seconds": float(int(time.monotonic() - self.started_at))},
        }

    def _summarise(self, count: int, first: str) -> None:
        self.post(
            live_error(
                "errors_suppressed", f"{count} more errors left out this second; the first: {first}"
            )
        )

    # --- in -------------------------------------------------------------------------------

    def parse(self, raw: str | bytes) -> tuple[dict[str, Any], str, str | None] | None:
        """One client message as (event, its type, its `event_id`); None once the client
        was told why it is not an event."""
        try:
            event = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            self.refuse("invalid_json", "the message is not JSON", None)
            return None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self.refuse("invalid_event", "an event is a JSON object with a `type`", None)
            return None
        client_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        return event, event["type"], client_id

    async def handle_raw(self, raw: str | bytes) -> bool:
        """`parse`, then `handle`: a sideband's messages (never audio)."""
        parsed = self.parse(raw)
        return parsed is not None and await self.handle(*parsed)

    async def handle(self, event: dict[str, Any], kind: str, client_id: str | None) -> bool:
        """Apply one client event (not an audio append: the transport's); True when the
        client asked to close."""
        session = self.session
        assert session is not None
        if kind in ("session.input_audio.mute", "session.input_audio.unmute"):
            self.muted = kind.endswith(".mute")
            self._ack(
                "session.input_audio.muted" if self.muted else "session.input_audio.unmuted",
                client_id,
            )
        elif kind in ("session.instructions.append", "session.thinking.append"):
            # Both join the conversation as notes the model reads (instructions stay in
            # the history; thinking is silent context); neither asks for speech.
            text = self._text(event, "content", client_id)
            if text is not None and self._delegation_id(event, client_id):
                if kind == "session.thinking.append":
                    self.delegations.appended()
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
            self._close(CLOSE_REQUESTED)
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

    def _delegation_id(self, event: dict[str, Any], client_id: str | None) -> bool:
        """Whether an append's `delegation_id` (absent or null: the session's own note)
        names a client delegation of this session; if not, the client was told."""
        delegation_id = event.get("delegation_id")
        if delegation_id is None:
            return True
        known = isinstance(delegation_id, str) and self.delegations.known(delegation_id)
        if known and self.client_delegation:
            return True
        why = (
            "a delegation id is not accepted with responses delegation"
            if not self.client_delegation and self.live.delegation is not None
            else f"no client delegation {delegation_id!r} exists in this session"
        )
        self.refuse("invalid_value", why, client_id, "delegation_id")
        return False

    async def _commentary_append(self, event: dict[str, Any], client_id: str | None) -> None:
        if "delegation_id" not in event:
            why = "`delegation_id` is required (null for commentary of the session's own)"
            self.refuse("missing_required_parameter", why, client_id, "delegation_id")
            return
        if not self._delegation_id(event, client_id):
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
        delegation_id = event["delegation_id"]
        answers = self.delegations.answer(delegation_id) if delegation_id else None
        try:
            await self.commentary.append(self.session, text, answers)
            self.delegations.appended()
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
        self._delegation_changed()
        message: Message = {
            "type": "session.updated",
            "event_id": new_id("event"),
            "session": self.snapshot(),
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
