"""GPT-Live over WebRTC: a call whose data channel speaks GPT-Live, not OpenAI Realtime.

The call's life (answering, the tracks, the data channel's inbox, the owner's watch, the
close) is WebRTCCall's; GPT-Live's events are the session's `LiveProtocol`, as on the
WebSocket and on a SIP call (realtime/live/live_protocol.py). What is WebRTC's own:

- Audio is on the tracks both ways (Opus), so no `session.output_audio.delta` exists and
  a `session.input_audio.append` is refused; `session.input_audio.mute` replaces the
  microphone's audio by silence, so the session's timeline goes on and no speech is heard.
- The page is untrusted: `client.data_channel` chose at start which client events it may
  send and which server events it may read (live_permissions.py).
- `session.started` is the first message on the channel (held until it opens), sent once
  the session is attached; a client's `session.close` ends the call after its
  `session.closed` has gone out (`GOODBYE_S` at most). A peer that hangs up or goes away
  ends the session too (`connection_lost`), with nobody left to tell.
- Sidebands (`/v1/live/sessions/{id}/attach`, realtime/live/live_sideband.py) find the
  session's protocol in `live_sessions` while the call lives; they read everything the
  session says (the page's permissions are not theirs), and their client events apply
  unrestricted.
- With a full-duplex model the session core streams the track to the model and plays its
  turns on the track (sessions/duplex_turns.py): nothing here differs.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import numpy.typing as npt
from aiortc import RTCPeerConnection

from sessions import ParleyError, Session
from sessions.events import Event, SessionClosed
from sessions.resample import SAMPLE_RATE

from ..metrics import TransportMetrics
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.webrtc.call import ChannelEvents, WebRTCCall
from ..transports.webrtc.call_options import CallOptions
from ..transports.websocket.sender import Message
from .live_accept import seed_history
from .live_config import LiveSessionConfig
from .live_permissions import DataChannelPermissions
from .live_protocol import CLOSE_REQUESTED, LiveProtocol
from .live_sideband import LiveSessions

log = logging.getLogger("parley.realtime.webrtc")

GOODBYE_S = 1.0
"""How long `session.closed` may take to leave before a closing call drops the channel."""


class LiveCall(WebRTCCall):
    REATTACHABLE = False  # GPT-Live defines no re-attach: a dropped peer ends the session

    def __init__(
        self,
        call_id: str,
        pc: RTCPeerConnection,
        live: LiveSessionConfig,
        metrics: TransportMetrics | None = None,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
        live_sessions: LiveSessions | None = None,
    ) -> None:
        super().__init__(call_id, pc, CallOptions(), metrics, slow)
        self.protocol = LiveProtocol(
            live, send=self._post, close=self.request_close, media_format=False
        )  # Opus on the tracks: the format is no setting
        self.live_sessions = live_sessions
        self.permissions = DataChannelPermissions.of(live)
        self.withheld = 0
        """Server messages the page was not allowed to read."""

    # --- setup ---------------------------------------------------------------------------

    @property
    def live_session_id(self) -> str | None:
        return None if self.session is None else self.session.session_id

    def attach(self, session: Session) -> None:
        self.protocol.bind(session)
        super().attach(session)
        self._spawn(self.protocol.run(), "live")

    async def start(self) -> None:
        """The history given at start, then `session.started`."""
        assert self.session is not None
        await seed_history(self.session, self.protocol.live)
        self._post(self.protocol.started(None))
        if self.live_sessions is not None:
            self.live_sessions.add(self.session.session_id, self.protocol)
            self.live_sessions.record(self.protocol)

    def _channel_events(self, session: Session) -> ChannelEvents:
        return _LiveChannel(self)

    # --- media ---------------------------------------------------------------------------

    async def hear(self, pcm: bytes) -> None:
        heard = bytes(len(pcm)) if self.protocol.muted else pcm
        if self.protocol.recording is not None:
            self.protocol.recording.hear(heard, SAMPLE_RATE)
        await super().hear(heard)

    async def audio(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        """The model's output, recorded (a stored session) as it goes to the track."""
        if self.protocol.recording is not None:
            self.protocol.recording.said(pcm, sample_rate)
        await super().audio(pcm, sample_rate)

    # --- events --------------------------------------------------------------------------

    def event(self, event: Event) -> None:
        for message, _after_audio in self.protocol.messages(event):
            self._post(message)  # the audio is on the track: nothing to wait for
        self.protocol.observe(event)
        if isinstance(event, SessionClosed):
            self.request_close(event.reason)

    def _post(self, message: Message) -> None:
        """A message of the session's: to every sideband, and to the page if it may."""
        self.protocol.forward(message)
        if self.permissions.may_read(message):
            self.events.send(message)
        else:
            self.withheld += 1

    def _audio_started(self) -> None:
        """GPT-Live has no playout news: its output never pauses."""

    def _audio_stopped(self) -> None:
        """As `_audio_started`."""

    def _cleared(self) -> None:
        """As `_audio_started`."""

    # --- the end -------------------------------------------------------------------------

    async def _farewell(self) -> None:
        """The page asked to close: its `session.closed` goes out before the channel
        does (a peer that hung up is not waited for)."""
        if self.close_reason == CLOSE_REQUESTED:
            with contextlib.suppress(TimeoutError):
                await self.events.sent(GOODBYE_S)

    async def close(self, reason: str = "hangup") -> None:
        try:
            await super().close(reason)
        finally:
            if self.live_sessions is not None and self.session is not None:
                self.live_sessions.discard(self.session.session_id)
            self.protocol.end()  # the session has ended: so have its sidebands
            if self.live_sessions is not None:
                await self.live_sessions.keep(self.protocol)


class _LiveChannel:
    """The data channel's client events, as GPT-Live's, within the page's permissions."""

    def __init__(self, call: LiveCall) -> None:
        self.call = call
        self.protocol = call.protocol

    async def handle_raw(self, raw: str | bytes) -> None:
        parsed = self.protocol.parse(raw)
        if parsed is None:
            return
        event, kind, client_id = parsed
        if not self.call.permissions.may_send(kind):
            why = f"{kind!r} is not among the client events this data channel may send"
            self.protocol.refuse("event_not_allowed", why, client_id, "type")
            return
        if kind == "session.input_audio.append":
            why = "audio comes on the media track here, not in events"
            self.protocol.refuse("unsupported_event", why, client_id, "type")
            return
        try:
            await self.protocol.handle(event, kind, client_id)
        except Exception:
            session_id = self.protocol.session.session_id if self.protocol.session else None
            log.exception("session %s: %s failed", session_id, kind)
            why = f"{kind} failed on the server; the session goes on"
            self.protocol.refuse("server_error", why, client_id)

    def report(self, error: ParleyError, client_event_id: str | None) -> None:
        self.protocol.refuse(error.code, str(error), client_event_id)

    def close(self) -> None:
        self.protocol.end()
