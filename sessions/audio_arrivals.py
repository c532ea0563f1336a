"""When each stretch of a session's input audio arrived: the audio's place on the clock
that camera frames are stamped with.

A session's audio lives on its input timeline (milliseconds of audio received; turns.py),
its frames on the server's wall clock, as they arrive (frame_window.py says why that one).
To find the frames of a turn, the turn's audio has to be placed on the wall clock: this
keeps, for the stretches of audio received, when each arrived. Audio that streams in real
time lands where it was spoken; audio sent in a burst (a file, a query's `audio_data`)
lands all at the moment it came, which is when the client said it.

Bounded: appends that arrive within `MERGE_MS` of a stretch's first join it (a WebRTC
microphone appends every 20 ms), and the oldest stretches go past `MAX_STRETCHES`, about
three minutes of live audio; audio older than what is kept is placed at the oldest arrival
kept, as is audio from before a resume on another process.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable

MERGE_MS = 50
MAX_STRETCHES = 4_096


def wall_ms() -> int:
    """The server's wall clock in ms (the clock frames are stamped with)."""
    return round(time.time() * 1000)


class AudioArrivals:
    def __init__(
        self, now_ms: Callable[[], int] = wall_ms, max_stretches: int = MAX_STRETCHES
    ) -> None:
        self.now_ms = now_ms
        self._stretches: deque[tuple[int, int]] = deque(maxlen=max_stretches)
        """(end offset, arrival) of each stretch, oldest first: the stretch is the audio
        from the previous one's end to its own."""

    def heard(self, end_offset_ms: int) -> None:
        """The input audio up to `end_offset_ms` has arrived, now."""
        now = self.now_ms()
        if self._stretches and now - self._stretches[-1][1] < MERGE_MS:
            self._stretches[-1] = (end_offset_ms, self._stretches[-1][1])
        else:
            self._stretches.append((end_offset_ms, now))

    def at(self, offset_ms: int) -> int:
        """When the audio at `offset_ms` arrived (audio not received yet: now)."""
        if not self._stretches:
            return self.now_ms()
        ends = [end for end, _ in self._stretches]
        index = bisect.bisect_right(ends, offset_ms)
        if index == len(ends):
            return self.now_ms()
        return self._stretches[index][1]
