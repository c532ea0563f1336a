"""One SIP call's media bound to one session: RTP in and out, DTMF, barge-in.

The call is the session's output sink, like a WebRTC call (realtime/webrtc/call.py): the
answer's audio goes to an 8 kHz playout buffer that the RTP endpoint plays out in 20 ms
packets, `clear` empties it at the next packet, and the session's events go to the call's
listeners (sideband WebSockets, `?call_id=`, through the same `CallEvents` as WebRTC).
The caller's audio goes to the session at 8 kHz (the session resamples it) and its keypad
digits become `session.dtmf`.

It owns its RTP endpoint (sockets and tasks) and `close()` ends the session and the
endpoint, once. `watch()` is the call's life: it returns when the call should end (the
SIP side ended it, or the session closed itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sessions import ParleyError, PlayoutBuffer, PlayoutSink, Session, SessionClosedError
from sessions.events import Event, SessionClosed

from ..webrtc.call_events import CallEvents, CallListener
from .rtp_session import PACKET_MS, RATE, RtpEndpoint
from .sdp_audio import Negotiated

log = logging.getLogger("parley.realtime.sip")

SESSION_CLOSE_TIMEOUT_S = 10.0


class SipMediaCall(PlayoutSink):
    def __init__(
        self, call_id: str, media: Negotiated, playout_ms: int = 2_000, rtcp_interval_s: float = 5.0
    ) -> None:
        super().__init__(PlayoutBuffer(RATE, playout_ms, piece_ms=PACKET_MS))
        self.call_id = call_id
        """The SIP Call-ID."""
        self.app_call_id: str | None = None
        """The id an app was given for the call (OpenAI's SIP flow), if any."""
        self.session: Session | None = None
        self.rtp = RtpEndpoint(
            media,
            self.playout,
            self._audio_in,
            self._digit,
            rtcp_interval_s=rtcp_interval_s,
            on_playing=self._playing,
        )
        self.events = CallEvents()
        self.close_reason = ""
        self.confirmed = False
        self.cleared_at: list[float] = []
        """Monotonic times of clears that dropped queued audio (barge-in)."""
        self._end = asyncio.Event()
        self._closed = False

    async def open(self, host: str) -> None:
        await self.rtp.open(host)

    def attach(self, session: Session) -> None:
        self.session = session

    # --- media in ------------------------------------------------------------------------

    async def _audio_in(self, pcm: bytes) -> None:
        session = self.session
        if session is None or not self.confirmed:
            return  # early media before the ACK is not the caller speaking to us
        try:
            await session.append_audio(pcm, RATE, 1)
        except SessionClosedError:
            pass
        except ParleyError as exc:
            log.info("call %s: session refused audio: %s", self.call_id, exc)

    def _digit(self, digit: str) -> None:
        if self.session is None:
            return
        with contextlib.suppress(SessionClosedError):
            self.session.dtmf(digit)

    def _playing(self, audible: bool) -> None:
        self.events.playout("started" if audible else "stopped")

    # --- the call's life -----------------------------------------------------------------

    def listen(self, listener: CallListener) -> bool:
        return self.events.listen(listener)

    def unlisten(self, listener: CallListener) -> None:
        self.events.unlisten(listener)

    def request_close(self, reason: str) -> None:
        if not self._end.is_set():
            self.close_reason = reason
            self._end.set()

    async def watch(self) -> None:
        await self._end.wait()

    async def close(self, reason: str = "hangup") -> None:
        """End the session, then the RTP endpoint. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.request_close(reason)
        if self.session is not None:
            try:
                async with asyncio.timeout(SESSION_CLOSE_TIMEOUT_S):
                    await self.session.close(self.close_reason)
            except TimeoutError:
                log.warning("call %s: the session did not close in time", self.call_id)
        self.playout.close()
        self.events.end(self.close_reason)
        await self.rtp.close()

    # --- OutputSink ----------------------------------------------------------------------

    def event(self, event: Event) -> None:
        extra = self.session is not None and self.session.config.extra_events
        self.events.session_event(event, extra_events=extra)
        if isinstance(event, SessionClosed):
            self.request_close(event.reason)

    def clear(self) -> None:
        if self.playout.queued_ms > 0:
            self.cleared_at.append(time.monotonic())
            self.events.playout("cleared")
        super().clear()
