"""A WebRTC call's settings, apart from the call itself.

The signaling routes read these at import time; the call (`call.py`) needs aiortc and PyAV,
which a server that never answers a WebRTC call should not have to load.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallOptions:
    video_fps_idle: float = 1.0
    video_fps_speaking: float = 2.0
    connect_timeout_s: float = 30.0
    disconnected_timeout_s: float = 15.0
    playout_ms: int = 2_000
    grace_s: float = 30.0
    """How long the session outlives a peer connection that failed or closed without a
    hang-up, for a re-attach (the WebSockets' resume grace: the server's
    `resume_grace_s`)."""
