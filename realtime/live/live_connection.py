"""GPT-Live over a WebSocket (`/v1/live/sessions`): one connection, one session.

The connection's lifecycle (reader, paced sender, size limit, close) is the
MessageConnection's (realtime/transports/websocket/connection.py); GPT-Live's message mapping is the
session's `LiveProtocol` (live_protocol.py, shared with SIP calls), and this connection adds
the audio both ways. As the `openai` SDK's `client.live` speaks it:

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
40 ms pieces at real-time pace (realtime/transports/websocket/sender.py).

Responses delegation (`response.event`, `response.item.create`, `response.create`):
live_delegation.py, Parley's own model as the backend. Not yet: client delegation events
(Parley's model never delegates to the client, so no delegation id exists for a commentary
to name), resume after a dropped connection (a drop ends the session: `connection_lost`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt
from starlette.websockets import WebSocket

from pipeline.tasks import TaskSet
from sessions import MediaError, Session, SessionManager
from sessions.events import Event

from ..g711 import G711, PCMA, PCMU
from ..openai.client_events import AudioFormats
from ..openai.websocket import output_payload
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.websocket.connection import MessageConnection
from ..transports.websocket.connections import ConnectionRegistry
from ..transports.websocket.sender import Message
from .live_config import LiveSessionConfig
from .live_errors import live_error
from .live_protocol import LiveProtocol

SILENCE_MS = 40
"""Silence between answers goes out in pieces this long (25 messages a second)."""


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
        super().__init__(
            websocket,
            manager,
            self._audio_message,
            grace_s=0,
            slow=slow,
            output_rate=formats.output_rate,
        )
        self.silence_ms = SILENCE_MS  # the output never pauses: silence between answers
        self.silence_rate = formats.output_rate
        self.formats = formats
        self.protocol = LiveProtocol(live, send=self.post, close=self.finish)
        """GPT-Live's mapping, and the session's sidebands (what they attach to)."""
        self._codec = G711()

    def bind(self, session: Session) -> None:
        self.session = session
        self.protocol.bind(session)

    def post(self, message: Message, *, after_audio: bool = False) -> None:
        super().post(message, after_audio=after_audio)
        self.protocol.forward(message)

    async def serve(self, registry: ConnectionRegistry[Self] | None) -> None:
        """The connection's life, with the task that speaks commentary when it may."""
        try:
            async with TaskSet("live:protocol") as speaking:
                speaking.create_task(self.protocol.run(), name=speaking.name)
                await super().serve(registry)
        finally:
            self.protocol.end()  # the session has ended: so have its sidebands

    # --- out ------------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        self.protocol.observe(event)

    def messages(self, event: Event) -> list[tuple[Message, bool]]:
        return self.protocol.messages(event)

    def _audio_message(self, pcm: npt.NDArray[np.int16], rate: int) -> Message:
        if self.protocol.recording is not None:
            self.protocol.recording.said(pcm, rate)
        payload = output_payload(pcm, rate, self.formats, self._codec)
        return {
            "type": "session.output_audio.delta",
            "delta": base64.b64encode(payload).decode("ascii"),
        }

    def error_message(self, code: str, text: str) -> Message:
        return live_error(code, text)

    def on_close(self) -> None:
        self.protocol.end()

    # --- in -------------------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> bool:
        parsed = self.protocol.parse(raw)
        if parsed is None:
            return False
        event, kind, client_id = parsed
        if kind == "session.input_audio.append":
            await self._append(event, client_id)
            return False
        return await self.protocol.handle(event, kind, client_id)

    async def _append(self, event: dict[str, Any], client_id: str | None) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            self.protocol.refuse(
                "missing_required_parameter", "`audio` (base64) is required", client_id, "audio"
            )
            return
        try:
            payload = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            self.protocol.refuse("invalid_value", "`audio` is not base64", client_id, "audio")
            return
        formats = self.formats
        if formats.input in (PCMU, PCMA):
            payload = self._codec.decode(payload, formats.input)
        elif len(payload) % 2:
            self.protocol.refuse(
                "invalid_value", "PCM16 audio has an even number of bytes", client_id, "audio"
            )
            return
        if self.protocol.muted:
            payload = bytes(len(payload))
        if self.protocol.recording is not None:
            self.protocol.recording.hear(payload, formats.input_rate)
        assert self.session is not None
        try:
            await self.session.append_audio(payload, formats.input_rate, 1)
        except MediaError as exc:  # empty, or too much at once: the session goes on
            self.protocol.refuse("invalid_value", str(exc), client_id, "audio")
