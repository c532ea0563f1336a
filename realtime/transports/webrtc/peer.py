"""Closing an aiortc peer connection for sure, whatever a bad offer left it in.

aiortc's `RTCPeerConnection.close()` stops the transceivers, the SCTP transport and then
every transport, in one pass that stops at the first exception: an offer that left a
transport unset (aiortc accepts a few such offers; `realtime.transports.webrtc.sdp` refuses
the ones known) makes close() raise halfway, with ICE sockets still open, and every later
close() then waits forever on a future that never completes. So a call closes its peer connection
here: close() under a deadline, and if it raises or overruns, each transport the peer
connection still reaches through its public attributes is stopped on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiortc import RTCPeerConnection

log = logging.getLogger("parley.realtime.webrtc")

CLOSE_TIMEOUT_S = 5.0


async def close_peer(pc: RTCPeerConnection, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close `pc`; never raises (cancellation aside), never waits past ~2x `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            await pc.close()
        return
    except TimeoutError:
        log.warning(
            "peer connection did not close within %.0f s; stopping its transports", timeout_s
        )
    except Exception as exc:
        log.warning(
            "peer connection close failed (%s: %s); stopping its transports",
            type(exc).__name__,
            exc,
        )
    await _stop_transports(pc, timeout_s)


async def _stop_transports(pc: RTCPeerConnection, timeout_s: float) -> None:
    dtls: list[Any] = []
    for transceiver in pc.getTransceivers():
        for transport in (transceiver.receiver.transport, transceiver.sender.transport):
            if transport is not None and transport not in dtls:
                dtls.append(transport)
    sctp = pc.sctp
    if sctp is not None and sctp.transport is not None and sctp.transport not in dtls:
        dtls.append(sctp.transport)
    for transport in dtls:
        for stop in (transport.stop, transport.transport.stop):
            with contextlib.suppress(Exception):
                async with asyncio.timeout(timeout_s / 4):
                    await stop()
