"""Which camera frames go with a turn: those of its own moment.

A question about what the camera shows now must be answered from what it showed while the
user asked, not from a minute ago. So a turn's frames come from its *time window*: the span
of its speech (with the prefix padding the turn detector already put before it) and the
`LOOKBACK_MS` just before that, on the session's one clock, the input audio timeline
(milliseconds of input audio received since the session began; turns.py). Transports stamp
each frame on that clock: the WebSockets with where the audio stood when the frame
arrived (neither protocol gives a frame a timestamp of its own), WebRTC with the frame's
RTP timestamp, converted (realtime/webrtc/frame_clock.py).

The rule, `choose_frames`:

- The candidates are the frames inside the window, and before them the frame on screen
  when the window opened (the last one before it): the similar-frame filter keeps a still
  picture as one frame, the first of it, so a camera that has shown the same thing for a
  minute has nothing newer to offer, and that frame is what the user was looking at.
- `num_frames` of the candidates are sampled as the session's `sampling_strategy` says
  (`uniform`: evenly, the first and the last included; `latest`: the newest).
- When no frame is that old (every frame came after the turn ended, or none came), the
  newest `num_frames` frames of the cache go instead.

The vLLM-Omni video chat stream keeps that protocol's own rule where its client asks for
it (a `sampling_strategy` in its `session.config`): `num_frames` sampled from the whole
cache, with no window (`VideoConfig.frame_window = "cache"`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

LOOKBACK_MS = 1_000
"""How far before the turn's audio (its prefix padding included) the window reaches: a
person points the camera and then asks, and at the WebRTC camera's idle rate (1 frame a
second) a second holds at least one frame."""

Strategy = Literal["uniform", "latest"]


@dataclass(frozen=True, slots=True)
class FrameWindow:
    """[begin_ms, end_ms] on the session's input audio timeline, both ends included (a
    frame that arrived with the turn's last audio is part of it)."""

    begin_ms: int
    end_ms: int

    def holds(self, timestamp_ms: int) -> bool:
        return self.begin_ms <= timestamp_ms <= self.end_ms


def turn_window(begin_ms: int, end_ms: int, lookback_ms: int = LOOKBACK_MS) -> FrameWindow:
    """The window of a turn whose audio is [begin_ms, end_ms) on the input timeline (a
    typed turn: begin and end are both where the audio stood when it was asked)."""
    return FrameWindow(begin_ms - lookback_ms, max(begin_ms, end_ms))


def sample_indices(count: int, n: int, strategy: Strategy) -> list[int]:
    """Which of `count` frames (oldest first) to send: `n` spread evenly, or the newest `n`."""
    n = min(n, count)
    if n <= 0:
        return []
    if strategy == "latest":
        return list(range(count - n, count))
    if n == 1:
        return [count - 1]
    return [round(i * (count - 1) / (n - 1)) for i in range(n)]


def choose_frames(
    timestamps: Sequence[int], window: FrameWindow | None, n: int, strategy: Strategy
) -> list[int]:
    """Indices (ascending) of the frames a turn sends, of frames stamped `timestamps`
    (oldest first); `window` None: sampled from all of them (the cache rule)."""
    if window is None:
        return sample_indices(len(timestamps), n, strategy)
    inside = [i for i, ts in enumerate(timestamps) if window.holds(ts)]
    before = [i for i, ts in enumerate(timestamps) if ts < window.begin_ms]
    candidates = sorted(before[-1:] + inside)
    if not candidates:
        return sample_indices(len(timestamps), n, "latest")
    return [candidates[i] for i in sample_indices(len(candidates), n, strategy)]
