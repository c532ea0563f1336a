"""Guards around aiortc 1.16 / aioice 0.13, so that no datagram can end a call.

What the fault tests (tests/realtime/test_webrtc_faults.py) found:

- aioice hands every datagram that does not parse as STUN to the DTLS transport, from any
  source address. An empty one makes aiortc's DTLS receive loop raise IndexError (it reads
  `data[0]`), which ends the loop: the call's media and data channel are gone, and the
  SCTP transport's next send raises in a task nobody awaits. Anyone who can reach the
  server's ICE port (it is in the answer) could end a call with one empty UDP packet.
- After SRTP authentication, aiortc's RTP parser raises `struct.error` (not the ValueError
  it handles) for a header-extension element of the wrong length, which ends the same loop:
  a peer's one malformed packet ends its own call.
- Opus that fails to decode logs one warning per 20 ms frame.

So datagrams that are neither DTLS nor RTP/RTCP (RFC 7983 tells them apart by their first
byte; aiortc would drop the others anyway, silently) are dropped where aioice queues them;
an exception from handling one authenticated RTP or RTCP packet drops that packet; decode
warnings are let through at most once per `LOG_EVERY_S` with a count of the rest. Each is
counted in `parley_webrtc_media_errors_total{kind}` (datagram, rtp, rtcp, decode; the
track drains add frame and refused: a decoded frame that could not be converted, or that
the session refused).

The first two patch methods of aiortc and aioice (the only place to stand: the failure is
inside their receive loops). `install()` checks that the methods still exist, patches once
per process, and each patch says what to delete when the dependency is fixed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aioice.ice
from aiortc.rtcdtlstransport import RTCDtlsTransport

from ...metrics import TransportMetrics

log = logging.getLogger("parley.realtime.webrtc")

LOG_EVERY_S = 10.0
"""At most one log line per kind of media error in this time (the metric counts them all)."""

_metrics: TransportMetrics | None = None
_installed = False


def install(metrics: TransportMetrics) -> None:
    """Count media errors on `metrics` from now on; patch aiortc and aioice once."""
    global _metrics, _installed
    _metrics = metrics
    if _installed:
        return
    _installed = True
    _guard_datagrams()
    _guard_packet_handler("_handle_rtp_data", "rtp")
    _guard_packet_handler("_handle_rtcp_data", "rtcp")
    logging.getLogger("aiortc.rtcrtpreceiver").addFilter(_DecodeErrors())


class _LogBudget:
    """One line per kind per LOG_EVERY_S, saying how many were left out since the last.
    Thread-safe: aiortc's decoders log from their own threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def admit(self, kind: str) -> int | None:
        """None: stay quiet; else how many were held back since the last line."""
        now = time.monotonic()
        with self._lock:
            if now < self._next.get(kind, 0.0):
                self._held[kind] = self._held.get(kind, 0) + 1
                return None
            self._next[kind] = now + LOG_EVERY_S
            return self._held.pop(kind, 0)


_budget = _LogBudget()


def count(kind: str, detail: str) -> None:
    """One inbound media error: counted always, logged at most once per LOG_EVERY_S."""
    if _metrics is not None:
        _metrics.media_errors.labels(kind=kind).inc()
    held = _budget.admit(kind)
    if held is not None:
        more = f" ({held} more since the last report)" if held else ""
        log.warning("inbound media dropped (%s): %s%s", kind, detail, more)


def _is_media(data: bytes) -> bool:
    """DTLS (20-63) or RTP/RTCP (128-191), by RFC 7983's first-byte ranges."""
    return bool(data) and (20 <= data[0] <= 63 or 128 <= data[0] <= 191)


def _guard_datagrams() -> None:
    # Delete when aiortc's RTCDtlsTransport._recv_next survives an empty datagram.
    original: Callable[[Any, bytes, int], None] = aioice.ice.Connection.data_received

    def data_received(self: Any, data: bytes, component: int) -> None:
        if not _is_media(data):
            count("datagram", f"a {len(data)}-byte datagram that is not DTLS, RTP or RTCP")
            return
        original(self, data, component)

    aioice.ice.Connection.data_received = data_received  # type: ignore[method-assign]


def _guard_packet_handler(name: str, kind: str) -> None:
    # Delete when aiortc's parsers raise only ValueError for malformed packets.
    original: Callable[..., Awaitable[None]] = getattr(RTCDtlsTransport, name)

    async def handle(self: Any, data: bytes, *args: Any, **kwargs: Any) -> None:
        try:
            await original(self, data, *args, **kwargs)
        except ConnectionError:
            raise  # the transport is closing: aiortc's loop ends the call's media itself
        except Exception as exc:
            count(kind, f"a {len(data)}-byte packet: {type(exc).__name__}: {exc}")

    setattr(RTCDtlsTransport, name, handle)


class _DecodeErrors(logging.Filter):
    """aiortc's "failed to decode" warnings: counted, and mostly held back."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "failed to decode" not in str(record.msg):
            return True
        if _metrics is not None:
            _metrics.media_errors.labels(kind="decode").inc()
        held = _budget.admit("decode")
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg} ({held} more since the last report)"
        return True
