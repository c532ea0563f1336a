"""The session core's clocks: wall time, and wall time compressed for tests."""

from __future__ import annotations

import asyncio
import time

import pytest

from sessions.clock import REAL_CLOCK, RealClock, ScaledClock


async def test_a_scaled_clock_passes_speed_times_faster() -> None:
    clock = ScaledClock(5.0)
    wall, start = time.monotonic(), clock.now()
    await clock.sleep(0.5)
    waited, passed = time.monotonic() - wall, clock.now() - start
    assert 0.09 <= waited < 0.3  # 0.5 s of its time is 0.1 s of wall time
    assert passed == pytest.approx(waited * 5.0, rel=0.05)
    with pytest.raises(TimeoutError):
        async with clock.timeout(1.0):  # 0.2 s of wall time
            await asyncio.sleep(1.0)
    assert time.monotonic() - wall < 0.9


async def test_the_real_clock_is_wall_time() -> None:
    assert isinstance(REAL_CLOCK, RealClock)
    wall, start = time.monotonic(), REAL_CLOCK.now()
    await REAL_CLOCK.sleep(0.05)
    assert REAL_CLOCK.now() - start == pytest.approx(time.monotonic() - wall, abs=0.005)
    assert REAL_CLOCK.now() - start >= 0.05


def test_a_scaled_clock_needs_a_positive_speed() -> None:
    with pytest.raises(ValueError, match="positive"):
        ScaledClock(0)
