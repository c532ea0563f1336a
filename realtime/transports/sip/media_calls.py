"""The SIP calls of this process, seen from the media side: the `CallHandler` the user agent
server drives (realtime/transports/sip/handler.py).

An INVITE's offer is checked first (no G.711: 488), then RTP sockets are bound, then the
session is admitted (at the global limit: 486 Busy Here), so a bad offer costs no session
slot. One owner task per call waits for its end (`SipMediaCall.watch`) and closes it, as
the WebRTC registry does; a call that the session ended itself (its lifetime, an idle
timeout, a server shutdown) is hung up from our side with a BYE through `hangup`. A CANCEL
that arrives while the session is being created ends the half-made call as soon as
`invite` returns. `ended` is idempotent and waits until the call is closed.

With a gate (OpenAI's SIP flow, `--sip-webhook`: realtime/transports/sip/call_gate.py) a call with a
usable offer waits for the app's decision before it is answered: Accept answers it with
the app's session configuration, and the call is then also found by the app's call id
(`get`, `hangup`); Reject is its final status; Refer redirects the unanswered call (a 302
whose Contact is the target), and `refer` transfers an answered one (a REFER in its dialog:
transfer.py). An Accept from a GPT-Live app (`decision.live`) answers the
call as a GPT-Live session (live_sip_call.py) whose id is the app's session id, known to
`live_sessions` while it lasts so that Live sidebands attach to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.tasks import TaskSet
from sessions import SessionConfig, SessionLimitError, SessionManager
from sessions.events import new_id

from ...live.live_accept import seed_history
from .call_gate import WebhookCallGate
from .close_reasons import SIP_ENDED
from .handler import Answer, Hangup, IncomingCall, Rejection, Transfer
from .pending_calls import Decision, Refer, Reject
from .sdp_audio import Negotiated, SdpError, build_answer, negotiate, parse_offer

if TYPE_CHECKING:  # the media side parses RTP with aiortc's classes: loaded at the first call
    from ...live.live_sideband import LiveSessions
    from .media_call import SipMediaCall

log = logging.getLogger("parley.realtime.sip")

ANSWER_WAIT_S = 10.0
"""How long a transfer waits for the answer of a call the app has just accepted."""


class SipCallNotFound(LookupError):
    pass


class TransferRefused(RuntimeError):
    """The REFER of an answered call did not get a 2xx: `status` is its final SIP status."""

    def __init__(self, call_id: str, target_uri: str, status: int) -> None:
        if status == 408:
            why = "the caller's side did not answer the transfer request (SIP 408)"
        elif status == 491:
            why = "a transfer of this call is already under way"
        elif status == 481:
            why = "the call is not up (not answered yet, or already over)"
        elif status == 501:
            why = "Parley's SIP side cannot transfer calls here"
        else:
            why = f"the caller's side refused the transfer (SIP {status})"
        super().__init__(f"call {call_id} was not transferred to {target_uri}: {why}")
        self.status = status


class CallGate(Protocol):
    async def decide(self, call: IncomingCall) -> Decision:
        """The app's decision on `call` (WebhookCallGate)."""
        ...


class SipMediaCalls:
    def __init__(
        self,
        manager: SessionManager,
        hangup: Hangup,
        *,
        host: str = "127.0.0.1",
        config: SessionConfig | Mapping[str, Any] | None = None,
        playout_ms: int = 2_000,
        rtcp_interval_s: float = 5.0,
        gate: CallGate | None = None,
        advertise: str | None = None,
        live_sessions: LiveSessions | None = None,
        transfer: Transfer | None = None,
    ) -> None:
        """`host`: where RTP sockets are bound; `advertise`: the address the SDP answers
        give for them (None: `host`; needed when `host` is a wildcard such as 0.0.0.0);
        `transfer`: the signalling side's REFER (None: answered calls cannot be referred)."""
        self.manager = manager
        self.advertise = advertise
        self.gate = gate
        self.live_sessions = live_sessions
        self._send_bye = hangup
        self._send_refer = transfer
        self.host = host
        self.config = config
        self.playout_ms = playout_ms
        self.rtcp_interval_s = rtcp_interval_s
        self._calls: dict[str, SipMediaCall] = {}
        self._tasks = TaskSet("sip-calls")
        """Owns each call's owner task and the clean-up of a call whose setup failed;
        `close()` closes it."""
        self._owners: dict[str, asyncio.Task[None]] = {}
        self._answering: set[str] = set()
        self._cancelled: set[str] = set()
        self._app_ids: dict[str, str] = {}
        """The app's call id (OpenAI's flow) -> the SIP Call-ID."""
        self._accepted: dict[str, str] = {}
        """SIP Call-ID -> the app's id, from the app's accept until the answer is made."""
        self._settled = asyncio.Condition()
        """Notified when a call's answer is made or given up (`refer` waits for it)."""
        self._sdp_ids: dict[str, tuple[int, int]] = {}
        """Call id -> (our SDP session id, its version), bumped by each re-INVITE answer."""

    def __len__(self) -> int:
        return len(self._calls)

    def call_ids(self) -> list[str]:
        """The SIP Call-IDs of the answered calls."""
        return list(self._calls)

    def app_ids(self) -> set[str]:
        """The app's ids (OpenAI's flow) of the calls here: ringing while the app decides,
        being answered, answered; the call index names them all (realtime/call_index.py),
        with no gap between one state and the next."""
        return self._being_answered() | set(self._app_ids)

    def get(self, call_id: str) -> SipMediaCall:
        """A call by its SIP Call-ID or the id the app was given."""
        try:
            return self._calls[self._app_ids.get(call_id, call_id)]
        except KeyError:
            raise SipCallNotFound(f"no SIP call {call_id}") from None

    async def hangup(self, call_id: str, reason: str = "hangup") -> None:
        """End a call from Parley's side (a BYE goes out); returns once it is closed."""
        call = self.get(call_id)
        call.request_close(reason)
        owner = self._owners.get(call.call_id)
        if owner is not None:
            await asyncio.wait({owner})

    def knows(self, call_id: str) -> bool:
        """`call_id` (the SIP Call-ID or the app's id) is a call here: answered, being
        answered, or ringing while its app decides."""
        return call_id in self._calls or call_id in self.app_ids()

    async def refer(self, call_id: str, target_uri: str) -> None:
        """Transfer the answered call `call_id` (the SIP Call-ID or the app's id) to
        `target_uri`; returns once the caller's side has taken the transfer on. The call ends
        when the target answers; until then, or if that fails, it goes on as it was. A call
        the app accepted a moment ago is transferred once its answer is made (an app may
        refer as soon as its accept returns). Raises SipCallNotFound, or TransferRefused with
        the REFER's status."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ANSWER_WAIT_S), self._settled:
                await self._settled.wait_for(lambda: call_id not in self._being_answered())
        call = self.get(call_id)
        status = (
            501 if self._send_refer is None else await self._send_refer(call.call_id, target_uri)
        )
        if not 200 <= status < 300:
            raise TransferRefused(call_id, target_uri, status)

    def _being_answered(self) -> set[str]:
        """The app's ids of the calls it has accepted (or is deciding) and not yet answered."""
        deciding = self.gate.app_ids() if isinstance(self.gate, WebhookCallGate) else set()
        return deciding | set(self._accepted.values())

    # --- CallHandler ---------------------------------------------------------------------

    async def invite(self, call: IncomingCall) -> Answer | Rejection:
        if call.call_id in self._calls or call.call_id in self._answering:
            return Rejection(482, "Loop Detected")  # the same dialog twice
        try:
            negotiated = negotiate(parse_offer(call.sdp))
        except SdpError as exc:
            log.info("call %s: unusable offer: %s", call.call_id, exc)
            return Rejection(488, "Not Acceptable Here")
        if isinstance(negotiated, Rejection):
            return negotiated
        self._answering.add(call.call_id)
        try:
            return await self._answer(call, negotiated)
        finally:
            self._answering.discard(call.call_id)
            self._cancelled.discard(call.call_id)
            self._accepted.pop(call.call_id, None)
            async with self._settled:
                self._settled.notify_all()

    async def _answer(self, call: IncomingCall, negotiated: Negotiated) -> Answer | Rejection:
        config, app_id, live = self.config, None, None
        if self.gate is not None:
            decision = await self.gate.decide(call)
            if isinstance(decision, Reject):
                return decision.rejection()
            if isinstance(decision, Refer):
                return Rejection(302, "Moved Temporarily", contact=decision.target_uri)
            config, app_id, live = decision.config, decision.call_id, decision.live
            self._accepted[call.call_id] = app_id
        if call.call_id in self._cancelled:
            return Rejection(487, "Request Terminated")
        from ...live.live_sip_call import LiveSipCall  # loads aiortc: at the first call
        from .media_call import SipMediaCall

        media: SipMediaCall
        session_id = new_id("sess")
        if live is not None and app_id is not None:  # a GPT-Live session, named as announced
            media = LiveSipCall(
                call.call_id, negotiated, live, self.playout_ms, self.rtcp_interval_s
            )
            session_id = app_id
        else:
            media = SipMediaCall(call.call_id, negotiated, self.playout_ms, self.rtcp_interval_s)
        try:
            await media.open(self.host)
            session = await self.manager.create(media, config, session_id)
            media.attach(session)  # from here, closing the call closes the session
            if isinstance(media, LiveSipCall):
                await seed_history(session, media.protocol.live)
        except SessionLimitError as exc:
            log.info("call %s refused: %s", call.call_id, exc)
            await media.close("busy")
            return Rejection(486, "Busy Here")
        except OSError as exc:
            log.warning("call %s: no RTP sockets: %s", call.call_id, exc)
            await media.close("no sockets")
            return Rejection(503, "Service Unavailable")
        except BaseException:
            if self._tasks.closed:
                await media.close("setup failed")
                raise
            # in a task of its own: a cancelled setup still closes the call (`close()` waits)
            cleanup = self._tasks.create_task(
                media.close("setup failed"), name=f"sip:{call.call_id}:discard"
            )
            await asyncio.shield(cleanup)
            raise
        if call.call_id in self._cancelled:
            await media.close(f"{SIP_ENDED}cancelled")
            return Rejection(487, "Request Terminated")
        if self._tasks.closed:  # closed during the setup: no owner for the call any more
            await media.close("server_shutdown")
            return Rejection(503, "Service Unavailable")
        self._calls[call.call_id] = media
        if app_id is not None:
            self._app_ids[app_id] = call.call_id
            media.app_call_id = app_id
        if isinstance(media, LiveSipCall) and self.live_sessions is not None:
            self.live_sessions.add(session.session_id, media.protocol)
        self._owners[call.call_id] = self._tasks.create_task(
            self._own(media), name=f"sip:{call.call_id}:owner"
        )
        sdp_id = secrets.randbelow(1 << 31)
        self._sdp_ids[call.call_id] = (sdp_id, 0)
        log.info("SIP call %s answered (session %s)", call.call_id, session.session_id)
        address = self.advertise or media.rtp.host
        return Answer(build_answer(negotiated, address, media.rtp.port, sdp_id))

    async def confirmed(self, call_id: str) -> None:
        call = self._calls.get(call_id)
        if call is not None:
            call.confirmed = True

    async def reinvite(self, call_id: str, sdp: str) -> Answer | Rejection:
        call = self._calls.get(call_id)
        if call is None:
            return Rejection(481, "Call/Transaction Does Not Exist")
        try:
            negotiated = negotiate(parse_offer(sdp))
        except SdpError:
            return Rejection(488, "Not Acceptable Here")
        if isinstance(negotiated, Rejection):
            return negotiated
        call.rtp.update(negotiated)
        sdp_id, version = self._sdp_ids.get(call_id, (0, 0))
        self._sdp_ids[call_id] = (sdp_id, version + 1)
        log.info("SIP call %s: re-INVITE, now %s", call_id, negotiated.direction)
        address = self.advertise or call.rtp.host
        return Answer(build_answer(negotiated, address, call.rtp.port, sdp_id, version + 1))

    async def ended(self, call_id: str, reason: str) -> None:
        if call_id in self._answering:
            self._cancelled.add(call_id)
            return
        call = self._calls.get(call_id)
        if call is None:
            return
        call.request_close(f"{SIP_ENDED}{reason}")
        owner = self._owners.get(call_id)
        if owner is not None and owner is not asyncio.current_task():
            await asyncio.wait({owner})

    # --- ownership -----------------------------------------------------------------------

    async def _own(self, call: SipMediaCall) -> None:
        try:
            await call.watch()
        finally:
            await call.close(call.close_reason or "hangup")
            self._calls.pop(call.call_id, None)
            self._owners.pop(call.call_id, None)
            self._sdp_ids.pop(call.call_id, None)
            if call.app_call_id is not None:
                self._app_ids.pop(call.app_call_id, None)
            if self.live_sessions is not None and call.session is not None:
                self.live_sessions.discard(call.session.session_id)
            log.info("SIP call %s closed (%s)", call.call_id, call.close_reason)
        if not call.close_reason.startswith(SIP_ENDED):
            try:
                await self._send_bye(call.call_id)
            except Exception:
                log.exception("SIP call %s: hanging up failed", call.call_id)

    async def close(self, reason: str = "server_shutdown") -> None:
        """End every call (each hung up with a BYE) and wait for them. Idempotent."""
        for call in list(self._calls.values()):
            call.request_close(reason)
        pending = list(self._owners.values())
        try:
            if pending:
                await asyncio.wait(pending)
        finally:
            await self._tasks.close()
