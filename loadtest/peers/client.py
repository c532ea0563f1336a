"""One caller for every peer: our `Caller` (loadtest/webrtc_client.py), signalling per peer.

The microphone, the ear (a timestamped RMS per received 20 ms frame) and the peer
connection are the Caller's; only the offer/answer exchange differs:

- parley:  POST /v1/realtime/calls, body = offer SDP (application/sdp) -> 201, answer SDP
           (OpenAI's WebRTC call flow; loopback `parley serve` needs no key);
- fastrtc: POST /webrtc/offer, JSON {sdp, type: "offer", webrtc_id} -> JSON {sdp, type};
           FastRTC starts sending audio once the client's data channel is open, which the
           Caller's `oai-events` channel provides (FastRTC takes any label);
- pipecat: POST /api/offer, JSON {sdp, type: "offer", pc_id: null} -> JSON {sdp, type, pc_id}.

`connect()` also times the call set-up the same way for all three: from the offer being
ready (after setLocalDescription) to `connectionState == "connected"`.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx
from aiortc import RTCSessionDescription

from loadtest.webrtc_client import LOUD, Caller

PEERS = ("parley", "fastrtc", "pipecat")
OFFER_PATHS = {"parley": "/v1/realtime/calls", "fastrtc": "/webrtc/offer", "pipecat": "/api/offer"}


class PeerCaller(Caller):
    def __init__(self, http: httpx.AsyncClient, peer: str) -> None:
        if peer not in PEERS:
            raise ValueError(f"unknown peer {peer!r}")
        super().__init__(http)
        self.peer = peer

    async def call(self, within_s: float = 20.0) -> float:
        """Place the call; returns ms from offer ready to connected."""
        self.pc.addTrack(self.mic)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        ready = time.monotonic()
        answer = await self._exchange(self.pc.localDescription.sdp)
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        while self.pc.connectionState != "connected":
            if time.monotonic() - ready > within_s or self.pc.connectionState == "failed":
                raise RuntimeError(f"{self.peer}: not connected ({self.pc.connectionState})")
            await asyncio.sleep(0.005)
        return (time.monotonic() - ready) * 1000

    async def _exchange(self, offer: str) -> str:
        path = OFFER_PATHS[self.peer]
        if self.peer == "parley":
            response = await self.http.post(
                path, content=offer, headers={"Content-Type": "application/sdp"}
            )
            if response.status_code != 201:
                raise RuntimeError(f"parley: {path} -> {response.status_code}")
            return response.text
        body: dict[str, str | None] = {"sdp": offer, "type": "offer"}
        if self.peer == "fastrtc":
            body["webrtc_id"] = secrets.token_hex(5)
        else:
            body["pc_id"] = None
        response = await self.http.post(path, json=body)
        response.raise_for_status()
        answer = response.json()
        if not isinstance(answer, dict) or "sdp" not in answer:
            raise RuntimeError(f"{self.peer}: offer refused: {str(answer)[:200]}")
        return str(answer["sdp"])

    def first_loud_after(self, since: float) -> float | None:
        return next((t for t, level in self.heard if t > since and level > LOUD), None)

    async def wait_loud(self, since: float, within_s: float) -> float | None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if (found := self.first_loud_after(since)) is not None:
                return found
            await asyncio.sleep(0.01)
        return None

    async def wait_quiet(self, quiet_s: float, within_s: float) -> float | None:
        """Wait until nothing loud has arrived for `quiet_s`; the last loud frame's time."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            last = next((t for t, level in reversed(self.heard) if level > LOUD), None)
            if last is None or time.monotonic() - last >= quiet_s:
                return last
            await asyncio.sleep(0.02)
        return None
