"""GPT-Live over WebRTC: a call whose data channel speaks GPT-Live, not OpenAI Realtime.

The call's life (answering, the tracks, the data channel's inbox, the owner's watch, the
close) is WebRTCCall's; GPT-Live's events are the LiveMapping's, as on the WebSocket
(realtime/live/live_mapping.py). What is WebRTC's own:

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
  session in `live_sessions` while the call lives; they read everything the session says
  (the page's permissions are not theirs), and their client events apply unrestricted.
- With a full-duplex model (bind_duplex), the microphone goes to the model, not to turn
  detection, and the model's voice, its own silences included, goes to the track.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import numpy as np
from aiortc import RTCPeerConnection

from pipeline.duplex import DUPLEX_RATE, DuplexStream
from sessions import ParleyError, Session
from sessions.events import ConversationItem, Event, SessionClosed
from sessions.resample import SAMPLE_RATE, OutputResampler

from ..live.live_accept import ROLES
from ..live.live_config import LiveSessionConfig
from ..live.live_mapping import CLOSE_REQUESTED, LiveMapping
from ..live.live_permissions import DataChannelPermissions
from ..live.live_sideband import SESSION_ENDED, LiveSessions, LiveSideband
from ..metrics import TransportMetrics
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..websocket.sender import Message
from .call import ChannelEvents, WebRTCCall
from .call_options import CallOptions

log = logging.getLogger("parley.realtime.webrtc")

GOODBYE_S = 1.0
"""How long `session.closed` may take to leave before a closing call drops the channel."""


class LiveCall(WebRTCCall):
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
        self.mapping = LiveMapping(live, self._post, audio_format=False)  # Opus on the tracks
        self.live_sessions = live_sessions
        self._sidebands: list[LiveSideband] = []
        self.permissions = DataChannelPermissions.of(live)
        self.withheld = 0
        """Server messages the page was not allowed to read."""
        self.duplex: DuplexStream | None = None
        """A full-duplex model's stream for this session (bind_duplex), instead of turns."""
        self._duplex_in = OutputResampler(SAMPLE_RATE, DUPLEX_RATE)
        self._release_duplex: Callable[[], None] | None = None

    def bind_duplex(self, stream: DuplexStream, release: Callable[[], None]) -> None:
        """Serve the session from a full-duplex model; `release` gives its slot back when
        the call closes."""
        self.duplex = stream
        self._release_duplex = release

    # --- setup ---------------------------------------------------------------------------

    def attach(self, session: Session) -> None:
        self.mapping.bind(session)
        super().attach(session)
        self._spawn(self.mapping.speak_commentary(), "commentary")
        if self.duplex is not None:
            self._spawn(self._duplex_voice(), "duplex-voice")

    async def start(self) -> None:
        """The history given at start, then `session.started`."""
        assert self.session is not None
        for item in self.mapping.live.input or ():
            text = item.content[0].text
            await self.session.add_item(ConversationItem(role=ROLES[item.role], text=text))
        self._post(self.mapping.started(None))
        if self.live_sessions is not None:
            self.live_sessions.add(self.session.session_id, self)

    def _channel_events(self, session: Session) -> ChannelEvents:
        return _LiveChannel(self)

    # --- media ---------------------------------------------------------------------------

    async def hear(self, pcm: bytes) -> None:
        if self.mapping.muted:
            pcm = bytes(len(pcm))
        if self.duplex is None:
            await super().hear(pcm)
            return
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.int16)
        self.duplex.feed(self._duplex_in.push(samples))

    async def _duplex_voice(self) -> None:
        """The duplex model's voice to the track, frame after frame."""
        assert self.duplex is not None
        async for frame in self.duplex.frames():
            await self.audio(frame.pcm, DUPLEX_RATE)

    # --- events --------------------------------------------------------------------------

    def event(self, event: Event) -> None:
        for message, _after_audio in self.mapping.messages(event):
            self._post(message)  # the audio is on the track: nothing to wait for
        self.mapping.observe(event)
        if isinstance(event, SessionClosed):
            self.request_close(event.reason)

    def _post(self, message: Message) -> None:
        """A message of the session's: to every sideband, and to the page if it may."""
        for sideband in list(self._sidebands):
            sideband.forward(message)
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

    # --- sidebands -----------------------------------------------------------------------

    def attach_sideband(self, sideband: LiveSideband) -> bool:
        """Send `sideband` the session's messages from now on; False once it has ended."""
        if self._end.is_set() or self._closed:
            return False
        self._sidebands.append(sideband)
        return True

    def detach_sideband(self, sideband: LiveSideband) -> None:
        if sideband in self._sidebands:
            self._sidebands.remove(sideband)

    async def handle(self, raw: str | bytes) -> bool:
        """A sideband's client event: applied as the session's own, unrestricted."""
        if await self.mapping.handle(raw):
            self.request_close(CLOSE_REQUESTED)
            return True
        return False

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
            for sideband in self._sidebands:  # the session has ended: so have they
                sideband.finish(SESSION_ENDED)
            self._sidebands.clear()
            self.mapping.close()
            release, self._release_duplex = self._release_duplex, None
            if release is not None:
                release()


class _LiveChannel:
    """The data channel's client events, as GPT-Live's, within the page's permissions."""

    def __init__(self, call: LiveCall) -> None:
        self.call = call
        self.mapping = call.mapping

    async def handle_raw(self, raw: str | bytes) -> None:
        parsed = self.mapping.parse(raw)
        if parsed is None:
            return
        kind, event, client_id = parsed
        if not self.call.permissions.may_send(kind):
            why = f"{kind!r} is not among the client events this data channel may send"
            self.mapping.refuse("event_not_allowed", why, client_id, "type")
            return
        try:
            close = await self.mapping.apply(kind, event, client_id)
        except Exception:
            session_id = self.mapping.session.session_id if self.mapping.session else None
            log.exception("session %s: %s failed", session_id, kind)
            why = f"{kind} failed on the server; the session goes on"
            self.mapping.refuse("server_error", why, client_id)
            return
        if close:
            self.call.request_close(CLOSE_REQUESTED)

    def report(self, error: ParleyError, client_event_id: str | None) -> None:
        self.mapping.refuse(error.code, str(error), client_event_id)

    def close(self) -> None:
        self.mapping.close()
