"""Session fixtures: a manager on the test Redis with a fake engine behind it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from sessions.manager import SessionManager
from sessions.session import Session, SessionLimits
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink

MakeSession = Callable[..., Awaitable[tuple[Session, ClockedSink]]]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def limits() -> SessionLimits:
    return SessionLimits(watchdog_interval_s=0.05)


@pytest.fixture
async def manager(
    redis: aioredis.Redis, engine: FakeEngine, limits: SessionLimits
) -> AsyncIterator[SessionManager]:
    async with SessionManager(redis, EnginePipeline(engine), max_sessions=8, limits=limits) as m:
        yield m


@pytest.fixture
async def make_session(manager: SessionManager) -> AsyncIterator[MakeSession]:
    sinks: list[ClockedSink] = []

    async def make(config: dict[str, Any] | None = None) -> tuple[Session, ClockedSink]:
        sink = await ClockedSink().__aenter__()
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
    """Send PCM16 mono to the session in chunks, optionally at the pace of a microphone."""
    step = rate * chunk_ms // 1000
    for start in range(0, len(pcm), step):
        await session.append_audio(pcm[start : start + step].tobytes(), rate, 1)
        await asyncio.sleep(chunk_ms / 1000 if realtime else 0)
