"""One SIP call's media bound to one session: RTP in and out, DTMF, barge-in.

The call is the session's output sink, like a WebRTC call (realtime/transports/webrtc/call.py): the
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

import contextlib
import logging
import time

from sessions import ParleyError, PlayoutBuffer, Session, SessionClosedError

from ...session_call import SessionCall
from .rtp_session import PACKET_MS, RATE, RtpEndpoint
from .sdp_audio import Negotiated

log = logging.getLogger("parley.realtime.sip")


class SipMediaCall(SessionCall):
    def __init__(
        self, call_id: str, media: Negotiated, playout_ms: int = 2_000, rtcp_interval_s: float = 5.0
    ) -> None:
        super().__init__(call_id, PlayoutBuffer(RATE, playout_ms, piece_ms=PACKET_MS))
        self.app_call_id: str | None = None
        """The id an app was given for the call (OpenAI's SIP flow), if any; `call_id` is
        the SIP Call-ID."""
        self.rtp = RtpEndpoint(
            media,
            self.playout,
            self._audio_in,
            self._digit,
            rtcp_interval_s=rtcp_interval_s,
            on_playing=self._playing,
        )
        self.confirmed = False
        self.cleared_at: list[float] = []
        """Monotonic times of clears that dropped queued audio (barge-in)."""

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

    async def watch(self) -> None:
        await self._end.wait()

    async def close(self, reason: str = "hangup") -> None:
        """End the session, then the RTP endpoint. Idempotent."""
        if not self._closing(reason):
            return
        await self._close_session()
        self.playout.close()
        self.events.end(self.close_reason)
        await self.rtp.close()

    def _cleared(self) -> None:
        self.cleared_at.append(time.monotonic())
        super()._cleared()
