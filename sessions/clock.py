"""The time a session lives by, as a parameter, so tests can compress it.

The session core waits on wall time in a few places: the watchdog's idle timeout, lifetime
warning and detach grace, and a response's chunk timeout and latency figures. They read
time and sleep through a `Clock`. A server uses `RealClock` (the default everywhere), which
is `time.monotonic()` and `asyncio.sleep`. Tests may pass a `ScaledClock(speed)`, where every
duration passes `speed` times faster (as LiveKit's tests do with a speed factor): the same
scenarios with the same limits and assertions, a fraction of the wait.

Not on the clock: what lives in Redis (key and lease TTLs expire in Redis's own time, so
the manager's upkeep that renews them stays real), and the safety timeouts that only bound
a teardown. Turn detection works on audio offsets, never on a clock.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time in seconds, and waits measured on it."""

    def now(self) -> float:
        """Seconds on a monotonic clock (only differences mean anything)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time."""
        ...

    def timeout(self, seconds: float) -> asyncio.Timeout:
        """`asyncio.timeout` for `seconds` of this clock's time."""
        ...


class RealClock:
    """Wall time: what a server runs on."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> asyncio.Timeout:
        return asyncio.timeout(seconds)


class ScaledClock:
    """Time that passes `speed` times faster than wall time (for tests)."""

    def __init__(self, speed: float) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, not {speed}")
        self.speed = speed
        self._origin = time.monotonic()

    def now(self) -> float:
        return self._origin + (time.monotonic() - self._origin) * self.speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds / self.speed)

    def timeout(self, seconds: float) -> asyncio.Timeout:
        return asyncio.timeout(seconds / self.speed)


REAL_CLOCK: Clock = RealClock()
"""The default of every session-core class that takes a clock."""
