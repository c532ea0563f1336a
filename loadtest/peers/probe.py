"""The server-side probe every peer's process loads first (FastRTC, Pipecat and Parley alike).

Each framework counts late audio its own way, or not at all, so one yardstick is put inside
each server instead: aiortc's `RTCRtpSender._next_encoded_frame` (the one place every
outbound Opus payload passes, whichever framework drives the track) is wrapped to stamp each
20 ms audio payload. A payload is late when it leaves more than 40 ms after its slot on the
earliest schedule `t0 + k * 20 ms` seen in its talkspurt (a gap of 0.5 s or more starts a new
talkspurt: FastRTC sends nothing between answers, Pipecat and Parley send silence).

Also: ICE gathers on loopback only, and a stats endpoint in a thread of its own (so it still
answers when the event loop is overloaded) serves `GET /stats[?reset=1]` and `/gc` on
127.0.0.1:$PROBE_PORT: frames, late, max_late_ms, rss_mb, cpu_s, threads.

Nothing happens on import (tests import it too): a bot calls `install_from_env()` first.
Standard library and aiortc only: it is imported by the peers' own venvs, which do not have
Parley installed.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aioice.ice
from aiortc import rtcrtpsender

SLOT_S = 0.020
LATE_S = 0.040
SPURT_GAP_S = 0.5


class FrameClock:
    """Counts late payloads per sender (thread-safe: read by the stats thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.frames = 0
        self.late = 0
        self.max_late_ms = 0.0
        self._spurts: dict[int, tuple[float, int, float]] = {}  # sender -> (t0, k, last)

    def stamp(self, sender: int, now: float) -> None:
        with self.lock:
            spurt = self._spurts.get(sender)
            if spurt is None or now - spurt[2] >= SPURT_GAP_S:
                t0, k = now, 0
            else:
                t0, k = spurt[0], spurt[1] + 1
            late = now - (t0 + k * SLOT_S)
            if late < 0:  # earlier than the schedule so far: that is the better schedule
                t0, late = now - k * SLOT_S, 0.0
            self._spurts[sender] = (t0, k, now)
            self.frames += 1
            self.late += late > LATE_S
            self.max_late_ms = max(self.max_late_ms, round(late * 1000, 1))

    def snapshot(self, reset: bool) -> dict[str, Any]:
        with self.lock:
            out = {"frames": self.frames, "late": self.late, "max_late_ms": self.max_late_ms}
            if reset:
                self.frames, self.late, self.max_late_ms = 0, 0, 0.0
            out["senders"] = len(self._spurts)
        return out


CLOCK = FrameClock()
_original = rtcrtpsender.RTCRtpSender._next_encoded_frame


async def _stamped(self: Any, codec: Any) -> Any:
    encoded = await _original(self, codec)
    if encoded is not None and self.kind == "audio":
        now = time.monotonic()
        for _ in encoded.payloads:
            CLOCK.stamp(id(self), now)
    return encoded


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class _Stats(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        if self.path.startswith("/gc"):
            gc.collect()
        out = CLOCK.snapshot(reset="reset=1" in self.path)
        times = os.times()
        out.update(
            rss_mb=round(_proc_status("VmRSS") / 1024, 1),
            cpu_s=times.user + times.system,
            threads=_proc_status("Threads"),
            pid=os.getpid(),
        )
        body = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _loopback(use_ipv4: bool = True, use_ipv6: bool = False) -> list[str]:
    return ["127.0.0.1"]


def install(port: int | None) -> None:
    aioice.ice.get_host_addresses = _loopback
    rtcrtpsender.RTCRtpSender._next_encoded_frame = _stamped  # type: ignore[method-assign]
    if port:
        server = ThreadingHTTPServer(("127.0.0.1", port), _Stats)
        threading.Thread(target=server.serve_forever, name="peer-probe", daemon=True).start()


def install_from_env() -> None:
    """What every bot calls before it serves: the port comes from $PROBE_PORT."""
    install(int(os.environ.get("PROBE_PORT", "0")) or None)
