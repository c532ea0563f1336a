"""The calls of this process: answer an offer, find a call, hang up, close them all.

The registry owns one task per call, which waits for the call's end (`WebRTCCall.watch`) and
then closes it, so every call is closed exactly once by its owner however it ends.
"""

from __future__ import annotations

import asyncio
import logging

from aiortc import RTCPeerConnection, RTCSessionDescription

from sessions.config import SessionConfig
from sessions.events import new_id
from sessions.manager import SessionManager

from ..ice import IceSettings
from ..metrics import TransportMetrics
from ..sdp import OfferError, check_offer
from .call import CallOptions, WebRTCCall

log = logging.getLogger("parley.realtime.webrtc")


class CallNotFound(LookupError):
    pass


class CallRegistry:
    def __init__(
        self, manager: SessionManager, ice: IceSettings, metrics: TransportMetrics | None = None
    ) -> None:
        self.manager = manager
        self.ice = ice
        self.metrics = metrics or TransportMetrics()
        self._calls: dict[str, WebRTCCall] = {}
        self._owners: dict[str, asyncio.Task[None]] = {}
        ice.apply()

    def __len__(self) -> int:
        return len(self._calls)

    async def create(
        self, offer: bytes, config: SessionConfig, options: CallOptions | None = None
    ) -> tuple[WebRTCCall, str]:
        """Answer `offer`: (the call, the answer SDP). OfferError for a bad offer;
        SessionLimitError at the session cap. Nothing is left behind on failure."""
        sdp = check_offer(offer)
        call_id = new_id("rtc")
        pc = RTCPeerConnection(self.ice.rtc_configuration())
        call = WebRTCCall(call_id, pc, options or CallOptions(), self.metrics)
        try:
            session = await self.manager.create(call, config, session_id=new_id("sess"))
            call.attach(session)
            try:
                await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            except Exception as exc:  # aiortc's parser: anything it cannot take is a bad offer
                raise OfferError(f"the offer could not be used: {exc}") from None
            pc.addTrack(call.track)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
        except BaseException:
            await call.close("setup failed")
            raise
        self._calls[call_id] = call
        self.metrics.calls.inc()
        self._owners[call_id] = asyncio.create_task(self._own(call), name=f"{call_id}:owner")
        log.info("call %s answered (session %s)", call_id, call.session and call.session.session_id)
        return call, pc.localDescription.sdp

    async def _own(self, call: WebRTCCall) -> None:
        try:
            await call.watch()
        finally:
            await call.close(call.close_reason or "hangup")
            if self._calls.pop(call.call_id, None) is not None:
                self.metrics.calls.dec()
            self._owners.pop(call.call_id, None)
            log.info("call %s closed (%s)", call.call_id, call.close_reason)

    def get(self, call_id: str) -> WebRTCCall:
        try:
            return self._calls[call_id]
        except KeyError:
            raise CallNotFound(f"no call {call_id}") from None

    async def hangup(self, call_id: str, reason: str = "hangup") -> None:
        call = self.get(call_id)
        call.request_close(reason)
        owner = self._owners.get(call_id)
        if owner is not None:
            await asyncio.wait({owner})

    async def close(self, reason: str = "server_shutdown") -> None:
        """Hang up every call and wait for them to close. Idempotent."""
        for call in list(self._calls.values()):
            call.request_close(reason)
        owners = list(self._owners.values())
        if owners:
            await asyncio.wait(owners)
