"""Which camera frames go with a turn: those of its own moment.

A question about what the camera shows now must be answered from what it showed while the
user asked, not from a minute ago. So a turn's frames come from its *time window*: from
`LOOKBACK_MS` before its audio began (the prefix padding the turn detector puts before the
speech included) to the moment the turn was committed (the end of speech, or the commit
or query that closed it; a typed turn: the moment the answer starts).

One clock for audio and frames: the server's wall clock, as things arrive. A frame is
stamped when it arrives on a WebSocket (neither the OpenAI Realtime `input_image` nor the
video chat's `video.frame` carries a time of its own), or by its RTP timestamp over WebRTC,
converted to that clock (realtime/transports/webrtc/frame_clock.py). The audio is placed on it by
when each stretch of it arrived (audio_arrivals.py). Not the audio timeline itself (ms of
audio received): it stands still while a client sends no audio (push-to-talk, a video
chat client that sends the question's audio with the query), and every frame sent
meanwhile would get the same time.

The rule, `choose_frames`, falls back to the latest frames when the window holds none:

- `num_frames` of the frames inside the window, sampled as the session's
  `sampling_strategy` says (`uniform`: evenly, the first and the last included; `latest`:
  the newest).
- None inside: the newest frame before the window, the picture on screen when the user
  asked. One, not `num_frames`: the similar-frame filter keeps a still picture as one
  frame, the first of it, so a camera that has shown the same thing for a minute sends
  nothing newer, and the frames before that one are older scenes.
- None before it either (every frame came after the turn ended): the newest `num_frames`
  frames of the cache.

The vLLM-Omni video chat stream keeps that protocol's own rule where its client asks for
it (by naming a `sampling_strategy` in its `session.config`): `num_frames` sampled from
the whole cache, with no window (`VideoConfig.frame_window = "cache"`).
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
    """[begin_ms, end_ms] on the frames' clock (wall ms), both ends included."""

    begin_ms: int
    end_ms: int

    def holds(self, timestamp_ms: int) -> bool:
        return self.begin_ms <= timestamp_ms <= self.end_ms


def turn_window(arrived_ms: int, ended_ms: int, lookback_ms: int = LOOKBACK_MS) -> FrameWindow:
    """The window of a turn whose first audio arrived at `arrived_ms` and that ended at
    `ended_ms` (a typed turn: both are when it was asked)."""
    return FrameWindow(arrived_ms - lookback_ms, max(arrived_ms, ended_ms))


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
    if inside:
        return [inside[i] for i in sample_indices(len(inside), n, strategy)]
    before = [i for i, ts in enumerate(timestamps) if ts < window.begin_ms]
    if before and n > 0:
        return before[-1:]
    return sample_indices(len(timestamps), n, "latest")
