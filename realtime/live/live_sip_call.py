"""A SIP call answered as a GPT-Live session (`POST /v1/live/sessions/{id}/accept`).

Its media is a SIP call's like any other (RTP both ways, DTMF, barge-in: media_call.py);
what differs is who controls it and what they hear of it. A Realtime SIP call's events are
Realtime's, for `?call_id=` sidebands; a GPT-Live call's are GPT-Live's, mapped by the one
`LiveProtocol` every Live session has (realtime/live/live_protocol.py) and sent to the Live
sidebands attached to it (`/v1/live/sessions/{id}/attach`), the call's only control plane:
there is no message channel of the call's own, so the protocol's messages go to them alone.

A sideband's `session.close` hangs up (a BYE, `close_requested`), as does the API's hangup;
the caller's BYE ends the session with `remote_hangup`, and a transfer the app asked for
(its refer) with `close_requested` once the target has answered. Mute replaces the caller's
audio by silence, so the session's timeline goes on and nothing is heard. The task that speaks
commentary when it may lives as long as the call (`watch`).
"""

from __future__ import annotations

import dataclasses

from pipeline.tasks import TaskSet
from sessions import Session
from sessions.events import Event, SessionClosed

from ..transports.sip.close_reasons import SIP_BYE, SIP_TRANSFERRED
from ..transports.sip.media_call import SipMediaCall
from ..transports.sip.sdp_audio import Negotiated
from .live_config import LiveSessionConfig
from .live_protocol import CLOSE_REQUESTED, REMOTE_HANGUP, LiveProtocol

CLOSED_AS = {SIP_BYE: REMOTE_HANGUP, SIP_TRANSFERRED: CLOSE_REQUESTED}


class LiveSipCall(SipMediaCall):
    def __init__(
        self,
        call_id: str,
        media: Negotiated,
        live: LiveSessionConfig,
        playout_ms: int = 2_000,
        rtcp_interval_s: float = 5.0,
    ) -> None:
        super().__init__(call_id, media, playout_ms, rtcp_interval_s)
        self.protocol = LiveProtocol(live, send=None, close=self.request_close, media_format=False)
        """GPT-Live's mapping of the session, and its sidebands."""

    @property
    def live_session_id(self) -> str | None:
        return None if self.session is None else self.session.session_id

    def attach(self, session: Session) -> None:
        super().attach(session)
        self.protocol.bind(session)

    async def _audio_in(self, pcm: bytes) -> None:
        await super()._audio_in(bytes(len(pcm)) if self.protocol.muted else pcm)

    # --- OutputSink ----------------------------------------------------------------------

    def event(self, event: Event) -> None:
        if isinstance(event, SessionClosed) and event.reason in CLOSED_AS:
            event = dataclasses.replace(event, reason=CLOSED_AS[event.reason])
        for message, _after_audio in self.protocol.messages(event):
            self.protocol.forward(message)  # no audio goes to a sideband: nothing to wait for
        self.protocol.observe(event)
        if isinstance(event, SessionClosed):
            self.request_close(event.reason)

    # --- the call's life -----------------------------------------------------------------

    async def watch(self) -> None:
        async with TaskSet(f"sip:{self.call_id}:live") as speaking:
            speaking.create_task(self.protocol.run(), name=speaking.name)
            await super().watch()

    async def close(self, reason: str = "hangup") -> None:
        """As a SIP call's, then the sidebands end (after their `session.closed`)."""
        try:
            await super().close(reason)
        finally:
            self.protocol.end()
