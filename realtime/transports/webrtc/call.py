"""One WebRTC call: a peer connection bound to one session.

The call is the session's output sink: assistant audio goes to the outbound track's playout
buffer, events go out on the `oai-events` data channel as OpenAI Realtime's GA sequence
(call_events.py; sideband WebSockets attached with `?call_id=` get them too), and `clear`
empties the playout at the next frame. It owns every task it starts (the track drains, the
data-channel reader) and `close()` ends them, the session and the peer connection, once.
`watch()` is the call's life: it returns when the call should end (hang-up, a peer that
never connects or stays disconnected or leaves its data channel unread for the
slow-client bound (`client_too_slow`: realtime/slow_clients.py), the session closing
itself).

A peer connection that fails, closes or stays disconnected without a hang-up does not end
the session: the call detaches it, and it waits `CallOptions.grace_s` for a new offer that
carries its resume token (registry.py's `reattach`); the answer in progress ends,
truncated to what was played. So does a call that another one re-attaches to
(`take_over`), and a re-attached call that never connects. A hang-up, a slow client or
the session's own end closes the session with the call.

The caller's audio is decoded on the event loop (inline_decode.py), not in a thread of
aiortc's per call.

The peer connection is answered before the session exists (a bad offer must cost no
session slot), so tracks that arrive first are held until `attach`. Client events wait in
an inbox bounded in count and bytes: the data channel cannot push back on a client, so a
burst beyond it is dropped, and an oversized message is refused; each gets an `error`,
and those errors share the dispatcher's throttle (a few a second, then one summary), so a
flood of bad messages cannot flood the channel, the session's event log or the log file.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Protocol

from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection

from pipeline.tasks import TaskSet
from sessions import ParleyError, PlayoutBuffer, Session, SessionClosedError
from sessions.resample import SAMPLE_RATE

from ...metrics import TransportMetrics
from ...openai.client_events import ProtocolError
from ...openai.dispatch import ClientEventDispatcher
from ...session_call import SESSION_CLOSE_TIMEOUT_S, SessionCall
from ...slow_clients import DEFAULT_SLOW_CLIENTS, TOO_SLOW, SlowClients
from .audio_jitter import release_at_once
from .call_options import CallOptions
from .inbound import drain_audio, drain_video
from .inline_decode import decode_inline
from .outbound import OUTPUT_RATE, OutboundAudioTrack, sends_opus
from .peer import close_peer

log = logging.getLogger("parley.realtime.webrtc")

DATA_CHANNEL = "oai-events"
INBOUND_MESSAGES = 64
INBOUND_BYTES = 2 * 1024 * 1024
"""What the inbox holds at most: a few large events (images) or many small ones."""
MAX_MESSAGE_BYTES = 256 * 1024
"""aiortc's SCTP `max-message-size` in our answer; a conforming client sends no more."""
ERROR_LIMIT = 20
"""`error` events about the client's own messages per second; the rest are summarised."""

PEER_FAILED = "peer connection failed"
PEER_CLOSED = "peer connection closed"
PEER_DISCONNECTED = "peer disconnected"
NEVER_CONNECTED = "peer never connected"
TAKEN_OVER = "taken_over"
DROPPED = frozenset({PEER_FAILED, PEER_CLOSED, PEER_DISCONNECTED, TAKEN_OVER})
"""Ends that leave the session waiting for a re-attach (the peer may come back)."""


_EVENT_ID = re.compile(rb'"event_id"\s*:\s*"([^"\\]{1,256})"')
EVENT_ID_SCAN_BYTES = 1024
"""How far into a refused message its `event_id` is looked for (it is not parsed)."""


def client_event_id(message: str | bytes) -> str | None:
    """The `event_id` of a message refused unparsed (too large, or no room for it), when
    its first KiB names one; clients put it up front, and a flood must stay cheap."""
    head = message[:EVENT_ID_SCAN_BYTES]
    found = _EVENT_ID.search(head.encode() if isinstance(head, str) else head)
    return found.group(1).decode(errors="replace") if found else None


class ChannelEvents(Protocol):
    """What a call's client events on the data channel go through: the protocol's
    mapping (OpenAI Realtime's dispatcher, or GPT-Live's: realtime/live/live_webrtc_call.py)."""

    async def handle_raw(self, raw: str | bytes) -> None:
        """Apply one client message; never raises for the client's fault."""

    def report(self, error: ParleyError, client_event_id: str | None) -> None:
        """An `error` about a client message, within the protocol's error budget."""

    def close(self) -> None:
        """No more errors of its own (the call is ending). Idempotent."""


class WebRTCCall(SessionCall):
    REATTACHABLE = True
    """Whether a dropped peer leaves the session for a re-attach (OpenAI Realtime's calls)."""

    def __init__(
        self,
        call_id: str,
        pc: RTCPeerConnection,
        options: CallOptions,
        metrics: TransportMetrics | None = None,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    ) -> None:
        super().__init__(call_id, PlayoutBuffer(OUTPUT_RATE, options.playout_ms))
        self.pc = pc
        self.options = options
        self.metrics = metrics or TransportMetrics()
        self.slow = slow
        self.track = OutboundAudioTrack(
            self.playout, self._audio_started, self._audio_stopped, self.metrics.frame
        )
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue(INBOUND_MESSAGES)
        self._inbox_bytes = 0
        self._early_tracks: list[MediaStreamTrack] = []
        self.refused_messages = 0
        """Client messages dropped (inbox full) or refused (too large)."""
        self._tasks = TaskSet(call_id)
        self._dispatcher: ChannelEvents | None = None
        self._created = time.monotonic()
        self.reattached = False
        """A new peer connection for a session that was already there."""
        self._done = asyncio.Event()
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)

    # --- setup ---------------------------------------------------------------------------

    def attach(self, session: Session) -> None:
        self.session = session
        answer = self.pc.localDescription
        if answer is not None and sends_opus(answer.sdp):
            self.track.encode_opus()
        self._dispatcher = self._channel_events(session)
        self._spawn(self._read_channel(), "events-in")
        early, self._early_tracks = self._early_tracks, []
        for track in early:
            self._on_track(track)

    async def start(self) -> None:
        """Once attached, before the answer goes back: what the protocol does first
        (nothing for OpenAI Realtime: its session announces itself)."""

    def _channel_events(self, session: Session) -> ChannelEvents:
        """The protocol spoken on the data channel: OpenAI Realtime's."""
        return ClientEventDispatcher(
            session, transport="webrtc", clear_output=self.clear, error_limit=ERROR_LIMIT
        )

    async def hear(self, pcm: bytes) -> None:
        """The caller's microphone, 16 kHz mono PCM16, as it comes: to the session."""
        assert self.session is not None
        await self.session.append_audio(pcm, SAMPLE_RATE, 1)

    def _spawn(self, coro: Any, what: str) -> None:
        # Not a TaskGroup: these tasks outlive the callback that starts them (a track or
        # the data channel arriving); `close()` is their owner and ends them.
        self._tasks.create_task(coro, name=f"{self.call_id}:{what}")

    def _on_track(self, track: MediaStreamTrack) -> None:
        if self._closed:
            return
        if track.kind == "audio":  # before its receiver starts: it starts on connecting
            for transceiver in self.pc.getTransceivers():
                if transceiver.receiver.track is track:
                    decode_inline(transceiver.receiver)
                    release_at_once(transceiver.receiver)
        if self.session is None:  # the offer is being answered; the session comes next
            self._early_tracks.append(track)
            return
        if track.kind == "audio":
            self._spawn(drain_audio(track, self.session, self.hear), "audio-in")
        elif track.kind == "video":
            self._spawn(drain_video(track, self.session, self._video_fps), "video-in")

    def _video_fps(self, speaking: bool) -> float:
        return self.options.video_fps_speaking if speaking else self.options.video_fps_idle

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != DATA_CHANNEL:
            log.info("call %s: ignoring data channel %r", self.call_id, channel.label)
            return
        channel.on("message", self._on_message)
        self.events.open(channel)

    def _on_message(self, message: str | bytes) -> None:
        size = len(message)
        if size > MAX_MESSAGE_BYTES:
            self._refuse(
                message,
                "message_too_large",
                f"the message is {size:,} bytes; the limit is {MAX_MESSAGE_BYTES:,} per event",
            )
        elif self._inbox.full() or self._inbox_bytes + size > INBOUND_BYTES:
            self._refuse(
                message,
                "rate_limited",
                "too many client events at once; this one was dropped (send them more slowly)",
            )
        else:
            self._inbox_bytes += size
            self._inbox.put_nowait(message)

    def _refuse(self, message: str | bytes, code: str, text: str) -> None:
        """An `error` about a message that is not applied, pointing at its `event_id`
        like one about a malformed message, within the dispatcher's error budget."""
        self.refused_messages += 1
        if self._dispatcher is not None:
            event_id = client_event_id(message)
            self._dispatcher.report(ProtocolError(code, text, event_id), event_id)

    async def _read_channel(self) -> None:
        """One reader, so client events are applied in the order they were sent."""
        assert self._dispatcher is not None
        try:
            while True:
                raw = await self._inbox.get()
                self._inbox_bytes -= len(raw)
                await self._dispatcher.handle_raw(raw)
        finally:
            self._dispatcher.close()

    # --- the call's life -----------------------------------------------------------------

    async def watch(self) -> None:
        """Returns when the call should end."""
        disconnected_since: float | None = None
        connected = False
        while not self._end.is_set():
            state = self.pc.connectionState
            now = time.monotonic()
            if state == "connected":
                connected, disconnected_since = True, None
            elif state in ("failed", "closed"):
                self.request_close(PEER_FAILED if state == "failed" else PEER_CLOSED)
            elif state == "disconnected":
                disconnected_since = disconnected_since or now
                if now - disconnected_since >= self.options.disconnected_timeout_s:
                    self.request_close(PEER_DISCONNECTED)
            if not connected and now - self._created >= self.options.connect_timeout_s:
                self.request_close(NEVER_CONNECTED)
            stalled_s = self.events.stalled_s(now)
            if stalled_s >= self.slow.stall_s and not self._end.is_set():
                self.request_close(TOO_SLOW)
                why = f"its data channel sent nothing for {stalled_s:.1f} s"
                session_id = self.session.session_id if self.session is not None else None
                self.slow.closed("webrtc_events", session_id, why)
            try:
                async with asyncio.timeout(0.25):
                    await self._end.wait()
            except TimeoutError:
                pass

    async def close(self, reason: str = "hangup") -> None:
        """End the session, the tasks and the peer connection. Idempotent.

        Each step has a deadline, so a session that is slow to end cannot keep the peer
        connection (its sockets) open."""
        if not self._closing(reason):
            return
        try:
            detached = self.resumable
            if detached:
                await self._detach_session()
            else:
                await self._close_session()
            await self._farewell()
            self.events.end(self.close_reason)
            await self._tasks.close()
            self._early_tracks.clear()
            self.track.stop()
            await close_peer(self.pc)
            if detached and self.hung_up:  # hung up while the dropped call closed
                await self._close_session()
        finally:
            self._done.set()

    @property
    def resumable(self) -> bool:
        """Whether the call ended in a way that leaves its session for a re-attach."""
        if not self.REATTACHABLE or self.session is None or self.hung_up:
            return False
        reason = self.close_reason
        return reason in DROPPED or (self.reattached and reason == NEVER_CONNECTED)

    async def take_over(self) -> None:
        """A new peer connection re-attaches to this call's session: end this call
        (detaching the session), and return once it has ended."""
        self.request_close(TAKEN_OVER)
        await self._done.wait()

    async def _detach_session(self) -> None:
        """The peer has gone, maybe for a moment: the answer in progress stops (truncated
        to what was played), and the session waits `grace_s` for a re-attach."""
        session = self.session
        assert session is not None
        try:
            async with asyncio.timeout(SESSION_CLOSE_TIMEOUT_S):
                await session.detach(self.options.grace_s)
        except SessionClosedError:
            return
        except TimeoutError:
            log.warning("call %s: session not detached in time; closing it", self.call_id)
            await self._close_session()
            return
        log.info(
            "call %s ended (%s); session %s kept %g s for a re-attach",
            self.call_id,
            self.close_reason,
            session.session_id,
            self.options.grace_s,
        )

    async def _farewell(self) -> None:
        """Between the session's end and the peer connection's: what the protocol still
        sends (nothing for OpenAI Realtime, whose session says goodbye itself)."""

    # --- helpers -------------------------------------------------------------------------

    def _audio_started(self) -> None:
        self.events.playout("started")

    def _audio_stopped(self) -> None:
        self.events.playout("stopped")
