"""Session fixtures: a manager on the test Redis with a fake engine behind it.

Everything here lives on one clock: wall time by default; a test module that sets `CLOCK`
to a `ScaledClock` runs its session, engine, sinks and microphone faster. (A module
attribute, not a fixture: tests/realtime imports these fixtures by name.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from sessions.clock import REAL_CLOCK, Clock
from sessions.manager import SessionManager
from sessions.session import Session, SessionLimits
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink

MakeSession = Callable[..., Awaitable[tuple[Session, ClockedSink]]]


def module_clock(request: pytest.FixtureRequest) -> Clock:
    """The test module's `CLOCK` if it sets one, else wall time."""
    clock: Clock = getattr(request.module, "CLOCK", REAL_CLOCK)
    return clock


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> FakeEngine:
    return FakeEngine(clock=module_clock(request))


@pytest.fixture
def limits() -> SessionLimits:
    return SessionLimits(watchdog_interval_s=0.05)


@pytest.fixture
async def manager(
    redis: aioredis.Redis,
    engine: FakeEngine,
    limits: SessionLimits,
    request: pytest.FixtureRequest,
) -> AsyncIterator[SessionManager]:
    pipeline, clock = EnginePipeline(engine), module_clock(request)
    async with SessionManager(redis, pipeline, max_sessions=8, limits=limits, clock=clock) as m:
        yield m


@pytest.fixture
async def make_session(manager: SessionManager) -> AsyncIterator[MakeSession]:
    sinks: list[ClockedSink] = []

    async def make(config: dict[str, Any] | None = None) -> tuple[Session, ClockedSink]:
        sink = await ClockedSink(clock=manager.clock).__aenter__()
        sinks.append(sink)
        session = await manager.create(sink, config)
        await sink.wait_for(lambda e: e.type == "session.created")
        return session, sink

    yield make
    await manager.close()
    for sink in sinks:
        await sink.__aexit__(None, None, None)


async def feed(
    session: Session,
    pcm: np.ndarray,
    rate: int = 16_000,
    realtime: bool = False,
    chunk_ms: int = 20,
) -> None:
    """Send PCM16 mono to the session in chunks, optionally at the pace of a microphone
    (on the session's clock)."""
    step = rate * chunk_ms // 1000
    for start in range(0, len(pcm), step):
        await session.append_audio(pcm[start : start + step].tobytes(), rate, 1)
        if realtime:
            await session.clock.sleep(chunk_ms / 1000)
        else:
            await asyncio.sleep(0)
