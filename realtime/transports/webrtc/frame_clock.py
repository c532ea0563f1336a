"""A camera frame's time on the session's clock, from its RTP timestamp.

A session stamps audio and frames on one clock, the server's wall clock as things arrive
(sessions/frame_window.py picks a turn's frames by it; the microphone's audio reaches it in
real time). A WebRTC video frame carries its RTP timestamp (aiortc puts it in the decoded
frame's `pts`, 90 kHz), which says exactly how far apart the camera took two frames, but
on the sender's clock, from an arbitrary start. `FrameClock` converts it: a frame's time is
its RTP time plus an offset, the smallest `arrival - RTP time` seen so far. The frame that
reached us fastest sets the offset, so a frame held up (the jitter buffer, a busy event
loop, the JPEG encode of the one before) keeps its real place, and no frame is ever
stamped later than it arrived.

When the RTP time jumps (a new stream, the 32-bit wrap after 13 hours, a sender that
stalled), the clocks part: a frame that would land more than `RESYNC_MS` before its
arrival starts a new offset at its arrival. A frame without a timestamp is stamped on
arrival.
"""

from __future__ import annotations

from fractions import Fraction

RESYNC_MS = 1_000
"""How far before its arrival a frame may be stamped before the offset is taken again."""


class FrameClock:
    """Stamps one video track's frames on the session's input audio timeline."""

    def __init__(self, resync_ms: int = RESYNC_MS) -> None:
        self._resync_ms = resync_ms
        self._offset_ms: float | None = None

    def stamp(self, pts: int | None, time_base: Fraction | None, now_ms: int) -> int:
        """The time of a frame with RTP time `pts` (in `time_base` seconds) that arrived
        at `now_ms`."""
        if pts is None or not time_base:
            return now_ms
        media_ms = float(pts * time_base * 1000)
        delay = now_ms - media_ms
        offset = self._offset_ms
        if offset is None or delay < offset or delay - offset > self._resync_ms:
            self._offset_ms = offset = delay
        return round(media_ms + offset)
