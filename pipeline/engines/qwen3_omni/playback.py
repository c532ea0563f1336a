"""A request's playback deadline: when its listener would run out of audio.

The stages that make audio (Talker, Code2Wav) schedule their steps by it (`StepBatcher`):
under load, the request nearest to running dry goes first, so no listener hears a gap while
another request is seconds ahead of its playback.

A listener that starts playing at the first audio has heard, by time t, `t - first_audio_at`
seconds; it runs dry at `first_audio_at + produced` (`produced`: the seconds of audio made so
far). Before any audio, the deadline is the request's arrival plus a first-audio budget: a new
request is urgent (its first sound is what the person waits for), but not more urgent than a
playing request within `budget_s` of running dry, whose gap the listener would hear mid-reply.

Each stage keeps its own `Playback` per request and counts what it makes: the Talker 80 ms a
frame (audio only after Code2Wav, a chunk later: close enough to order requests by), Code2Wav
the samples it renders. The clock is monotonic seconds; tests pass their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]

FIRST_AUDIO_BUDGET_S = 0.3
"""Before its first audio, a request is due this long after it arrived (a first-audio target
of the order of the issue's: 300 ms alone)."""


class Playback:
    def __init__(
        self, clock: Clock = time.monotonic, budget_s: float = FIRST_AUDIO_BUDGET_S
    ) -> None:
        if budget_s < 0:
            raise ValueError("budget_s must be at least 0")
        self._clock = clock
        self._first_due = clock() + budget_s
        self._first_audio_at: float | None = None
        self.produced_s = 0.0
        """Seconds of audio made for the request so far."""

    def produced(self, seconds: float) -> None:
        """Count `seconds` more audio; the first call starts the listener's playback."""
        if self._first_audio_at is None:
            self._first_audio_at = self._clock()
        self.produced_s += seconds

    def deadline(self) -> float:
        """When the listener runs out of audio (on the clock); earlier is more urgent."""
        if self._first_audio_at is None:
            return self._first_due
        return self._first_audio_at + self.produced_s
