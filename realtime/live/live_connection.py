"""GPT-Live over a WebSocket (`/v1/live/sessions`): one connection, one session.

The connection's lifecycle (reader, paced sender, size limit, close) is the
MessageConnection's (realtime/websocket/connection.py); this is GPT-Live's message mapping
on top, as the `openai` SDK's `client.live` speaks it:

- in: `session.input_audio.append` (never acknowledged; in the format chosen at start),
  `session.input_audio.mute` / `.unmute` (acknowledged; while muted the microphone's
  audio is replaced by silence, so the session's timeline goes on and no speech is heard),
  `session.instructions.append` and `session.thinking.append` (developer notes and
  silent context: each a system note in the conversation, which asks for no speech;
  acknowledged with its place on the timeline), `session.commentary.append` (a note the
  assistant says at its next turn: live_commentary.py), `session.update` (the delegation only,
  answered with `session.updated`), `session.close`. Anything else gets an
  `error` naming the event (`client_event_id`) and the session goes on.
- out: `session.output_audio.delta` (paced at real time, as the Realtime WebSocket's
  audio), `session.input_transcript.delta` / `session.output_transcript.delta` with
  `start_ms` / `end_ms` on the session's timeline (ms since it started: the user's speech
  where the turn detector heard it, the assistant's text where its audio was reached),
  `error`, and `session.closed` with the reason and the usage, last.

There is no client control of turns: Parley's own turn detection and barge-in decide when
the assistant speaks and when it stops, as the model does in GPT-Live.

Output audio never pauses, as GPT-Live's: between answers the sender streams silence in
40 ms pieces at real-time pace (realtime/websocket/sender.py).

Responses delegation (`response.event`, `response.item.create`, `response.create`):
live_delegation.py, Parley's own model as the backend. Not yet: client delegation events
(Parley's model never delegates to the client, so no delegation id exists for a commentary
to name), resume after a dropped connection (a drop ends the session: `connection_lost`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError
from starlette.websockets import WebSocket

from pipeline.tasks import cancel_and_wait
from sessions import ConfigError, MediaError, Session, SessionManager
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

from ..client_events import AudioFormats
from ..error_throttle import ErrorThrottle
from ..g711 import G711, PCMA, PCMU
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..websocket.connection import CLIENT_CLOSED, MessageConnection
from ..websocket.connections import ConnectionRegistry
from ..websocket.openai_ws import output_payload
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
from .live_sideband import LiveSideband

ERROR_LIMIT = 20
"""`error` events about the client's own messages per second; the rest are summarised."""

SILENCE_MS = 40
"""Silence between answers goes out in pieces this long (25 messages a second)."""

CLOSE_REQUESTED = "close_requested"

CLOSED_REASONS = {
    CLOSE_REQUESTED: "close_requested",
    CLIENT_CLOSED: "close_requested",
    "max_duration": "expired",
    "expired": "expired",
}
"""Parley's reason for a session's end -> GPT-Live's; any other is `connection_lost`."""


class LiveConnection(MessageConnection):
    TRANSPORT: ClassVar[str] = "live_ws"
    RESUMABLE: ClassVar[frozenset[str]] = frozenset()
    """A GPT-Live session ends with its connection (`connection_lost` when it drops)."""

    def __init__(
        self,
        websocket: WebSocket,
        manager: SessionManager,
        *,
        live: LiveSessionConfig,
        formats: AudioFormats,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    ) -> None:
        super().__init__(websocket, manager, self._audio_message, grace_s=0, slow=slow)
        self.silence_ms = SILENCE_MS  # the output never pauses: silence between answers
        self.silence_rate = formats.output_rate
        self.live = live
        self.formats = formats
        self.muted = False
        self.started_at = time.monotonic()
        self.expires_at = int(time.time()) + 3600
        self._codec = G711()
        self._errors = ErrorThrottle(self._summarise, limit=ERROR_LIMIT)
        self._speech: dict[str, tuple[int, int]] = {}
        """item id -> where the user's speech lies on the timeline (ms), as heard."""
        self._heard: dict[str, str] = {}
        """item id -> transcript text already sent as deltas."""
        self._spoken_ms = 0
        self._commentary = Commentary()
        self._backend = ResponsesBackend()
        self._sidebands: list[LiveSideband] = []
        """Controllers attached to this session (live_sideband.py): each is sent what this
        connection is sent, but the audio."""

    def bind(self, session: Session) -> None:
        self.session = session
        self.started_at = time.monotonic()
        self.expires_at = int(time.time() + session.limits.max_lifetime_s)

    def attach_sideband(self, sideband: LiveSideband) -> bool:
        """Send `sideband` this connection's messages from now on; False once it has ended."""
        if self._end.is_set() or self.closed:
            return False
        self._sidebands.append(sideband)
        return True

    def detach_sideband(self, sideband: LiveSideband) -> None:
        if sideband in self._sidebands:
            self._sidebands.remove(sideband)

    def post(self, message: Message, *, after_audio: bool = False) -> None:
        super().post(message, after_audio=after_audio)
        for sideband in list(self._sidebands):
            sideband.forward(message)

    def started(self, client_event_id: str | None) -> Message:
        assert self.session is not None
        message: Message = {
            "type": "session.started",
            "event_id": new_id("event"),
            "session": resolved(self.live, self.session.session_id, self.expires_at),
        }
        if client_event_id is not None:
            message["client_event_id"] = client_event_id
        return message

    def _now_ms(self) -> int:
        return round((time.monotonic() - self.started_at) * 1000)

    async def serve(self, registry: ConnectionRegistry[Self] | None) -> None:
        """The connection's life, with the task that speaks commentary when it may."""
        speaker = asyncio.create_task(self._commentary.run(), name="live:commentary")
        try:
            await super().serve(registry)
        finally:
            await cancel_and_wait(speaker)
            for sideband in self._sidebands:  # the session has ended: so have they
                sideband.finish("session_ended")
            self._sidebands.clear()

    # --- out ------------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        self._commentary.observe(event)

    def messages(self, event: Event) -> list[tuple[Message, bool]]:
        if isinstance(event, ResponseCreated | FunctionCallArgumentsDone | ResponseDone):
            return [(m, False) for m in self._backend.messages(event, self._now_ms())]
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
            at = self._now_ms()
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
        start, end = self._speech.get(item_id, (self._now_ms(), self._now_ms()))
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
            "session": resolved(self.live, self.session.session_id, self.expires_at),
            "usage": {"seconds": float(int(time.monotonic() - self.started_at))},
        }

    def _audio_message(self, pcm: npt.NDArray[np.int16], rate: int) -> Message:
        payload = output_payload(pcm, rate, self.formats, self._codec)
        return {
            "type": "session.output_audio.delta",
            "delta": base64.b64encode(payload).decode("ascii"),
        }

    def error_message(self, code: str, text: str) -> Message:
        return live_error(code, text)

    def _summarise(self, count: int, first: str) -> None:
        self.post(
            live_error(
                "errors_suppressed", f"{count} more errors left out this second; the first: {first}"
            )
        )

    def on_close(self) -> None:
        self._errors.close()

    # --- in -------------------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> bool:
        try:
            event = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            self._refuse("invalid_json", "the message is not JSON", None)
            return False
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self._refuse("invalid_event", "an event is a JSON object with a `type`", None)
            return False
        kind: str = event["type"]
        client_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        session = self.session
        assert session is not None
        if kind == "session.input_audio.append":
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
                at = self._now_ms()
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
            self.finish(CLOSE_REQUESTED)
            return True
        elif kind == "session.start":
            self._refuse("session_already_started", "the session has started already", client_id)
        else:
            self._refuse(
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
            self._refuse("missing_required_parameter", why, client_id, "delegation_id")
            return
        delegation_id = event["delegation_id"]
        if delegation_id is not None:
            delegation = self.live.delegation
            why = (
                "a delegation id is not accepted with responses delegation"
                if delegation is not None and delegation.type == "responses"
                else f"no client delegation {delegation_id!r} exists in this session"
            )
            self._refuse("invalid_value", why, client_id, "delegation_id")
            return
        text = self._text(event, "content", client_id)
        if text is None:
            return
        if len(text) > MAX_CHARS:
            self._refuse(
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
            self._refuse("commentary_backlog", str(exc), client_id, "content")
            return
        at = self._now_ms()
        self._ack("session.commentary.appended", client_id, start_ms=at, end_ms=at)

    async def _update(self, event: dict[str, Any], client_id: str | None) -> None:
        """Only the delegation settings change after start (GPT-Live's rule)."""
        body = event.get("session")
        if not isinstance(body, dict) or set(body) - {"delegation"}:
            extra = sorted(set(body) - {"delegation"}) if isinstance(body, dict) else []
            text = "session.update changes only `delegation` once the session has started"
            param = f"session.{extra[0]}" if extra else "session"
            self._refuse("invalid_value", text, client_id, param)
            return
        try:
            delegation = LiveDelegation.model_validate(body.get("delegation") or {"type": "client"})
            check_delegation(delegation)
        except ValidationError as exc:
            self._refuse(
                "invalid_value", str(exc.errors()[0]["msg"]), client_id, "session.delegation"
            )
            return
        except LiveConfigError as exc:
            self._refuse(exc.code, str(exc), client_id, exc.param)
            return
        assert self.session is not None
        try:
            await self.session.update(delegated_tools(delegation))
        except ConfigError as exc:  # a tool Parley's session cannot take
            self._refuse("invalid_value", str(exc), client_id, "session.delegation.responses")
            return
        except Exception as exc:  # the session's own trouble: its typed error, as elsewhere
            self.session.report_error(exc, client_id)
            return
        self.live = self.live.model_copy(update={"delegation": delegation})
        message: Message = {
            "type": "session.updated",
            "event_id": new_id("event"),
            "session": resolved(self.live, self.session.session_id, self.expires_at),
        }
        if client_id is not None:
            message["client_event_id"] = client_id
        self.post(message)

    def _responses_delegation(self, client_id: str | None) -> bool:
        delegation = self.live.delegation
        if delegation is not None and delegation.type == "responses":
            return True
        why = "this event requires responses delegation (the session's is client delegation)"
        self._refuse("invalid_request", why, client_id, "type")
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
            self._refuse("invalid_value", why, client_id, "item.type")
            return
        assert self.session is not None
        if item["type"] == "message":
            text = _message_text(item.get("content"))
            role = item.get("role")
            if text is None or role not in ("user", "developer", "system"):
                why = "a message item has a role (user, developer or system) and text content"
                self._refuse("invalid_value", why, client_id, "item")
                return
            await self.session.add_item(
                ConversationItem(role="user" if role == "user" else "system", text=text)
            )
            return
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not isinstance(output, str):
            why = "a function_call_output has a `call_id` and an `output` (text)"
            self._refuse("missing_required_parameter", why, client_id, "item.call_id")
            return
        if self._backend.output(call_id) is None:
            why = f"no function call {call_id!r} is waiting for its output"
            self._refuse("invalid_value", why, client_id, "item.call_id")
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
            self._refuse("invalid_request", why, client_id, "type")
            return
        self._backend.continue_work()
        try:
            await self.session.create_response()
        except Exception as exc:
            self._backend.forget_continuation()
            self.session.report_error(exc, client_id)

    async def _append(self, event: dict[str, Any], client_id: str | None) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            self._refuse(
                "missing_required_parameter", "`audio` (base64) is required", client_id, "audio"
            )
            return
        try:
            payload = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            self._refuse("invalid_value", "`audio` is not base64", client_id, "audio")
            return
        formats = self.formats
        if formats.input in (PCMU, PCMA):
            payload = self._codec.decode(payload, formats.input)
        elif len(payload) % 2:
            self._refuse(
                "invalid_value", "PCM16 audio has an even number of bytes", client_id, "audio"
            )
            return
        if self.muted:
            payload = bytes(len(payload))
        assert self.session is not None
        try:
            await self.session.append_audio(payload, formats.input_rate, 1)
        except MediaError as exc:  # empty, or too much at once: the session goes on
            self._refuse("invalid_value", str(exc), client_id, "audio")

    def _text(self, event: dict[str, Any], field: str, client_id: str | None) -> str | None:
        text = event.get(field)
        if not isinstance(text, str) or not text.strip():
            self._refuse("invalid_value", f"`{field}` must be non-empty text", client_id, field)
            return None
        return text

    def _ack(self, kind: str, client_id: str | None, **timeline: int) -> None:
        message: Message = {"type": kind, "event_id": new_id("event"), **timeline}
        if client_id is not None:
            message["client_event_id"] = client_id
        self.post(message)

    def _refuse(
        self, code: str, text: str, client_id: str | None, param: str | None = None
    ) -> None:
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
