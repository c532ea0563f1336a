"""What every call bound to a session has, whatever carries its media (WebRTC, SIP/RTP).

A call is the session's output sink (a `PlayoutSink`): the answer plays through its playout
buffer, and the session's events go to the call's listeners (the data channel, sideband
WebSockets) through one `CallEvents`. Its life is one event: `request_close(reason)` says
the call should end (a hang-up, the session closing itself, the transport gone), its
owner's `watch()` returns, and the owner closes it; the first reason given is the one kept.
Closing ends the session first, within a deadline, so that a session slow to end cannot
hold the call's sockets open.
"""

from __future__ import annotations

import asyncio
import logging

from sessions import PlayoutBuffer, PlayoutSink, Session
from sessions.events import Event, SessionClosed

from .openai.call_events import CallEvents, CallListener

log = logging.getLogger("parley.realtime.call")

SESSION_CLOSE_TIMEOUT_S = 10.0


class SessionCall(PlayoutSink):
    def __init__(self, call_id: str, playout: PlayoutBuffer) -> None:
        super().__init__(playout)
        self.call_id = call_id
        self.session: Session | None = None
        self.events = CallEvents()
        """The server events: to the call's own channel, and to sideband listeners."""
        self.close_reason = ""
        self._end = asyncio.Event()
        self._closed = False
        self.hung_up = False
        """Ended by a hang-up (the app's, the client's, the server's), which ends the
        session even where the peer dropped first and would leave it for a re-attach."""

    @property
    def live_session_id(self) -> str | None:
        """A GPT-Live call's session id (None for an OpenAI Realtime call). Its events are
        GPT-Live's, read on `/v1/live/sessions/{id}/attach`: an OpenAI Realtime sideband
        (`?call_id=`) would hear nothing of it, so it is refused, naming the right one."""
        return None

    def listen(self, listener: CallListener) -> bool:
        """A sideband connection reads the call's events from now on (False once the call
        has ended); it is told when the call ends."""
        return self.events.listen(listener)

    def unlisten(self, listener: CallListener) -> None:
        self.events.unlisten(listener)

    def request_close(self, reason: str) -> None:
        if not self._end.is_set():
            self.close_reason = reason
            self._end.set()

    def hang_up(self, reason: str) -> None:
        """End the call and its session. A hang-up that lands as the peer drops (a broken
        offer's ICE failing, a network gone) still ends the session: its reason replaces
        the drop's while the call has not begun closing, and a session the close already
        left for a re-attach is closed after it (`hung_up`)."""
        self.hung_up = True
        if not self._closed:
            self.close_reason = reason
        self.request_close(reason)

    def _closing(self, reason: str) -> bool:
        """Start closing (False if the call was closed already: `close` is idempotent)."""
        if self._closed:
            return False
        self._closed = True
        self.request_close(reason)
        return True

    async def _close_session(self) -> None:
        if self.session is None:
            return
        try:
            async with asyncio.timeout(SESSION_CLOSE_TIMEOUT_S):
                await self.session.close(self.close_reason)
        except TimeoutError:
            log.warning(
                "call %s: session %s did not close within %.0f s; closing the call anyway",
                self.call_id,
                self.session.session_id,
                SESSION_CLOSE_TIMEOUT_S,
            )

    # --- OutputSink ----------------------------------------------------------------------

    def event(self, event: Event) -> None:
        extra = self.session is not None and self.session.config.extra_events
        self.events.session_event(event, extra_events=extra)
        if isinstance(event, SessionClosed):
            self.request_close(event.reason)

    def clear(self) -> None:
        had_audio = self.playout.queued_ms > 0
        super().clear()
        if had_audio:
            self._cleared()

    def _cleared(self) -> None:
        """Queued answer audio was dropped (a barge-in)."""
        self.events.playout("cleared")
