"""GPT-Live over a WebSocket (`/v1/live/sessions`): one connection, one session.

The connection's lifecycle (reader, paced sender, size limit, close) is the
MessageConnection's (realtime/websocket/connection.py); GPT-Live's messages are the
LiveMapping's (live_mapping.py), shared with GPT-Live over WebRTC. What is the WebSocket's
own is the audio, as the `openai` SDK's `client.live` speaks it:

- in: `session.input_audio.append` (never acknowledged; in the format chosen at start;
  replaced by silence while the client has muted its input, so the session's timeline goes
  on and no speech is heard).
- out: `session.output_audio.delta`, paced at real time as the Realtime WebSocket's audio.
  Output audio never pauses, as GPT-Live's: between answers the sender streams silence in
  40 ms pieces at real-time pace (realtime/websocket/sender.py).

There is no client control of turns: Parley's own turn detection and barge-in decide when
the assistant speaks and when it stops, as the model does in GPT-Live.

Not yet: client delegation events (Parley's model never delegates to the client, so no
delegation id exists for a commentary to name), resume after a dropped connection (a drop
ends the session: `connection_lost`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt
from starlette.websockets import WebSocket

from pipeline.duplex import DUPLEX_RATE, DuplexStream
from pipeline.tasks import cancel_and_wait
from sessions import Session, SessionManager
from sessions.events import Event
from sessions.resample import OutputResampler

from ..client_events import AudioFormats
from ..g711 import G711, PCMA, PCMU
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..websocket.connection import MessageConnection
from ..websocket.connections import ConnectionRegistry
from ..websocket.openai_ws import output_payload
from ..websocket.sender import Message
from .live_config import LiveSessionConfig
from .live_errors import live_error
from .live_mapping import CLOSE_REQUESTED, LiveMapping
from .live_sideband import LiveSideband

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
        super().__init__(websocket, manager, self._audio_message, grace_s=0, slow=slow)
        self.silence_ms = SILENCE_MS  # the output never pauses: silence between answers
        self.silence_rate = formats.output_rate
        self.mapping = LiveMapping(live, self.post, append=self._append)
        self.formats = formats
        self._codec = G711()
        self._sidebands: list[LiveSideband] = []
        """Controllers attached to this session (live_sideband.py): each is sent what this
        connection is sent, but the audio."""
        self.duplex: DuplexStream | None = None
        """A full-duplex model's stream for this session (bind_duplex), instead of turns."""
        self._duplex_in: OutputResampler | None = None

    @property
    def live(self) -> LiveSessionConfig:
        """The session's configuration as it stands (the delegation may change)."""
        return self.mapping.live

    def bind(self, session: Session) -> None:
        self.session = session
        self.mapping.bind(session)

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

    def bind_duplex(self, stream: DuplexStream) -> None:
        """Serve the session from a full-duplex model: the microphone goes to the model as
        it comes, not to turn detection, and the model's voice is the output, frame after
        frame, its own silences included (so no silence is added between answers)."""
        self.duplex = stream
        self.silence_ms = 0
        if self.formats.input_rate != DUPLEX_RATE:
            self._duplex_in = OutputResampler(self.formats.input_rate, DUPLEX_RATE)

    def started(self, client_event_id: str | None) -> Message:
        return self.mapping.started(client_event_id)

    async def serve(self, registry: ConnectionRegistry[Self] | None) -> None:
        """The connection's life, with the task that speaks commentary when it may."""
        speaker = asyncio.create_task(self.mapping.speak_commentary(), name="live:commentary")
        voice = asyncio.create_task(self._duplex_voice(), name="live:duplex-voice")
        try:
            await super().serve(registry)
        finally:
            await cancel_and_wait(speaker, voice)
            for sideband in self._sidebands:  # the session has ended: so have they
                sideband.finish("session_ended")
            self._sidebands.clear()

    async def _duplex_voice(self) -> None:
        """The duplex model's voice to the client, paced as any output audio."""
        if self.duplex is None:
            return
        async for frame in self.duplex.frames():
            await self.audio(frame.pcm, DUPLEX_RATE)

    # --- out ------------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        self.mapping.observe(event)

    def messages(self, event: Event) -> list[tuple[Message, bool]]:
        return self.mapping.messages(event)

    def _audio_message(self, pcm: npt.NDArray[np.int16], rate: int) -> Message:
        payload = output_payload(pcm, rate, self.formats, self._codec)
        return {
            "type": "session.output_audio.delta",
            "delta": base64.b64encode(payload).decode("ascii"),
        }

    def error_message(self, code: str, text: str) -> Message:
        return live_error(code, text)

    def on_close(self) -> None:
        self.mapping.close()

    # --- in -------------------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> bool:
        if await self.mapping.handle(raw):
            self.finish(CLOSE_REQUESTED)
            return True
        return False

    async def _append(self, event: dict[str, Any], client_id: str | None) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            self.mapping.refuse(
                "missing_required_parameter", "`audio` (base64) is required", client_id, "audio"
            )
            return
        try:
            payload = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            self.mapping.refuse("invalid_value", "`audio` is not base64", client_id, "audio")
            return
        formats = self.formats
        if formats.input in (PCMU, PCMA):
            payload = self._codec.decode(payload, formats.input)
        elif len(payload) % 2:
            self.mapping.refuse(
                "invalid_value", "PCM16 audio has an even number of bytes", client_id, "audio"
            )
            return
        if self.mapping.muted:
            payload = bytes(len(payload))
        assert self.session is not None
        if self.duplex is not None:
            pcm = np.frombuffer(payload, dtype="<i2").astype(np.int16)
            if self._duplex_in is not None:
                pcm = self._duplex_in.push(pcm)
            self.duplex.feed(pcm)
            return
        await self.session.append_audio(payload, formats.input_rate, 1)
