"""The calls of this process: answer an offer, find a call, hang up, close them all.

The registry owns one task per call, which waits for the call's end (`WebRTCCall.watch`) and
then closes it, so every call is closed exactly once by its owner however it ends.

Answering an offer is two steps, in this order: aiortc answers it (under a deadline), then
the session is created. A bad offer therefore never holds a session slot, and whatever goes
wrong, the half-made call is closed before `create` returns (or, if the request itself is
cancelled, by a cleanup task that `close()` waits for): no peer connection, session or task
is left. aiortc raises all sorts for offers it cannot use (AttributeError, ValueError,
AssertionError, StopIteration...), so any exception from its three offer/answer calls is
the offer's fault (OfferError, a 400), except an OSError (no sockets: the server's fault).

Re-attaching (`reattach`): a new offer that names a session and carries its resume token
joins that session instead of starting one. The session may be here (its old call, if
still up, is taken over: it ends, detaching the session) or in another process, which
lets go of it (`claim_session`, as a WebSocket resume does); the new call's data channel
first gets what the client missed after its `last_event_id`, from the session's event
log (call_events.py). A wrong token, or a session that ended (its grace passed), is
`ReattachRefused`.

aiortc (and PyAV under it) is loaded at the first offer, and so are the process-wide ICE
addresses and the guards set then: every server makes a registry, and one that only ever
serves WebSockets (or a host without PyAV's FFmpeg) should not pay for WebRTC.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.tasks import TaskSet
from sessions import Session, SessionClosedError, SessionConfig, SessionManager
from sessions.events import new_id

from ...metrics import TransportMetrics
from ...openai.resume import read_log
from ...slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..websocket.connections import ConnectionRegistry, claim_session
from .call_options import CallOptions
from .ice import IceSettings
from .sdp import OfferError, check_offer

if TYPE_CHECKING:
    from aiortc import RTCPeerConnection

    from .call import WebRTCCall

MakeCall = Callable[[str, "RTCPeerConnection"], "WebRTCCall"]
"""(call id, peer connection) -> the call: how a protocol other than OpenAI Realtime's
(GPT-Live: realtime/live/live_webrtc_call.py) makes its calls."""

log = logging.getLogger("parley.realtime.webrtc")

SETUP_TIMEOUT_S = 10.0
"""aiortc's part of answering: ~10 ms on loopback; resolving mDNS candidates takes up to 1 s
and gathering from STUN/TURN servers up to 5 s."""


class CallNotFound(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class Reattach:
    """A new offer's claim on an existing session: its id, its resume token (both from
    `session.created`) and the last event the client got (None: replay the whole log)."""

    session_id: str
    resume_token: str
    last_event_id: str | None = None


class ReattachRefused(LookupError):
    """No session to re-attach to: it ended (or never was), or the token is wrong."""

    code = "session_not_found"


class CallSetupError(RuntimeError):
    """The server could not answer a valid-looking offer (sockets, a deadline): a 503."""

    code = "call_setup_failed"


class CallRegistry:
    def __init__(
        self,
        manager: SessionManager,
        ice: IceSettings,
        metrics: TransportMetrics | None = None,
        setup_timeout_s: float = SETUP_TIMEOUT_S,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    ) -> None:
        self.manager = manager
        self.slow = slow
        """What a call does about a peer that stops reading its data channel."""
        self.ice = ice
        self.metrics = metrics or TransportMetrics()
        self.setup_timeout_s = setup_timeout_s
        self._calls: dict[str, WebRTCCall] = {}
        self._owners: dict[str, asyncio.Task[None]] = {}
        self._by_session: ConnectionRegistry[WebRTCCall] = ConnectionRegistry()
        """The call that last served each session (up, or ended and resumable)."""
        self._cleanups: set[asyncio.Task[None]] = set()
        self._tasks = TaskSet("webrtc-calls")  # owns the owners and the clean-ups
        self._prepared = False

    def _prepare(self) -> None:
        """Before the first call: aioice gathers on our addresses, the guards count on our
        metrics (both process-wide)."""
        if self._prepared:
            return
        from . import guards

        self.ice.apply()
        guards.install(self.metrics)
        self._prepared = True

    def __len__(self) -> int:
        return len(self._calls)

    async def create(
        self,
        offer: bytes,
        config: SessionConfig,
        options: CallOptions | None = None,
        *,
        caller: str | None = None,
        make_call: MakeCall | None = None,
    ) -> tuple[WebRTCCall, str]:
        """Answer `offer`: (the call, the answer SDP). OfferError for a bad offer;
        CallSetupError when the server cannot answer; SessionLimitError at the session
        cap, KeyLimitError at `caller`'s limits. Nothing is left behind on failure.
        `make_call` makes the call (an OpenAI Realtime call if not given); the call's
        `start()` runs once its session is attached."""
        sdp = self._checked(offer)
        from aiortc import RTCPeerConnection

        from .call import WebRTCCall
        from .peer import close_peer

        self._prepare()
        call_id = new_id("rtc")
        pc = RTCPeerConnection(self.ice.rtc_configuration())
        if make_call is None:
            call = WebRTCCall(call_id, pc, options or CallOptions(), self.metrics, self.slow)
        else:
            try:
                call = make_call(call_id, pc)
            except BaseException:
                await close_peer(pc)
                raise
        try:
            answer = await self._answer(call, sdp)
            session = await self.manager.create(
                call, config, session_id=new_id("sess"), caller=caller
            )
            call.attach(session)
            await call.start()
        except BaseException:
            await self._discard(call)
            raise
        self._keep(call)
        log.info("call %s answered (session %s)", call_id, session.session_id)
        return call, answer

    async def reattach(
        self,
        offer: bytes,
        claim: Reattach,
        options: CallOptions | None = None,
        *,
        caller: str | None = None,
    ) -> tuple[WebRTCCall, str]:
        """Answer `offer` with a new call for the existing session `claim` names: (the
        call, the answer SDP). ReattachRefused when there is no such session to join;
        otherwise the errors of `create`. The session keeps its settings and history."""
        sdp = self._checked(offer)
        from aiortc import RTCPeerConnection

        from .call import WebRTCCall

        self._prepare()
        pc = RTCPeerConnection(self.ice.rtc_configuration())
        call = WebRTCCall(new_id("rtc"), pc, options or CallOptions(), self.metrics, self.slow)
        call.reattached = True
        try:
            answer = await self._answer(call, sdp)
            session = await self._claim(claim, caller)
            call.events.hold()  # live events wait for what the client missed
            session.attach(call)
            call.attach(session)
            logged = await read_log(session.event_log, session.session_id)
            extra = session.config.extra_events
            call.events.catch_up(logged, claim.last_event_id, extra_events=extra)
        except SessionClosedError:
            await self._discard(call)
            raise ReattachRefused(f"the session {claim.session_id} has just ended") from None
        except BaseException:
            await self._discard(call)
            raise
        self._keep(call)
        log.info("call %s re-attached to session %s", call.call_id, session.session_id)
        return call, answer

    async def _claim(self, claim: Reattach, caller: str | None) -> Session:
        """The session to re-attach to, its old call here (if any) ended first; a
        session of another process is taken over from Redis (SessionLimitError when
        this process takes no session now)."""
        claimed = await claim_session(
            self.manager, self._by_session, claim.session_id, claim.resume_token, caller=caller
        )
        if claimed is None:
            raise ReattachRefused(
                f"no session {claim.session_id} to re-attach to: it has ended (a session "
                "waits for a re-attach only so long after its call dropped), or the resume "
                "token is not its own"
            )
        return claimed[0]

    def _checked(self, offer: bytes) -> str:
        """The offer's SDP, checked (OfferError, counted as refused, if it fails)."""
        try:
            return check_offer(offer)
        except OfferError:
            self.metrics.offers_refused.labels(reason="checks").inc()
            raise

    def _keep(self, call: WebRTCCall) -> None:
        """An answered call: known by id and by session, owned by a task of its own."""
        self._calls[call.call_id] = call
        self._by_session.register(call)
        self.metrics.calls.inc()
        self._owners[call.call_id] = self._tasks.create_task(
            self._own(call), name=f"{call.call_id}:owner"
        )

    async def _answer(self, call: WebRTCCall, sdp: str) -> str:
        """aiortc's part: the answer SDP, under the setup deadline."""
        from aiortc import RTCSessionDescription

        pc = call.pc
        try:
            async with asyncio.timeout(self.setup_timeout_s):
                await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
                pc.addTrack(call.track)
                await pc.setLocalDescription(await pc.createAnswer())
        except TimeoutError:  # before OSError: a TimeoutError is one
            self.metrics.offers_refused.labels(reason="timeout").inc()
            raise CallSetupError(
                f"answering the offer took over {self.setup_timeout_s:g} s; try again"
            ) from None
        except OSError as exc:
            self.metrics.offers_refused.labels(reason="server").inc()
            log.warning("call %s: no media sockets: %s", call.call_id, exc)
            raise CallSetupError(f"the server could not open media sockets: {exc}") from None
        except Exception as exc:
            self.metrics.offers_refused.labels(reason="unanswerable").inc()
            log.info("call %s: aiortc could not answer the offer: %r", call.call_id, exc)
            detail = str(exc) or type(exc).__name__
            raise OfferError(f"the offer could not be answered: {detail}") from None
        description = pc.localDescription
        assert description is not None
        return description.sdp

    async def _discard(self, call: WebRTCCall) -> None:
        """Close a call that was never answered. It runs in a task of its own, so that a
        cancelled request still leaves nothing behind; `close()` waits for those tasks."""
        cleanup = self._tasks.create_task(
            call.close("setup failed"), name=f"{call.call_id}:discard"
        )
        self._cleanups.add(cleanup)
        cleanup.add_done_callback(self._cleanups.discard)
        await asyncio.shield(cleanup)

    async def _own(self, call: WebRTCCall) -> None:
        try:
            await call.watch()
        finally:
            await call.close(call.close_reason or "hangup")
            if not call.resumable:
                self._by_session.discard(call)
            if self._calls.pop(call.call_id, None) is not None:
                self.metrics.calls.dec()
            self._owners.pop(call.call_id, None)
            log.info("call %s closed (%s)", call.call_id, call.close_reason)

    def call_ids(self) -> list[str]:
        """The ids of the answered calls."""
        return list(self._calls)

    def get(self, call_id: str) -> WebRTCCall:
        try:
            return self._calls[call_id]
        except KeyError:
            raise CallNotFound(f"no call {call_id}") from None

    async def hangup(self, call_id: str, reason: str = "hangup") -> None:
        call = self.get(call_id)
        call.hang_up(reason)
        owner = self._owners.get(call_id)
        if owner is not None:
            await asyncio.wait({owner})

    async def close(self, reason: str = "server_shutdown") -> None:
        """Hang up every call and wait for them to close. Idempotent."""
        for call in list(self._calls.values()):
            call.request_close(reason)
        pending = [*self._owners.values(), *self._cleanups]
        try:
            if pending:
                await asyncio.wait(pending)
        finally:
            await self._tasks.close()
