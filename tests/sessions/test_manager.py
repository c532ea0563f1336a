"""Admission across processes, and shutdown with a goodbye to every session."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from sessions.errors import SessionLimitError, SessionNotFoundError
from sessions.events import SessionClosed
from sessions.leases import LeaseRegistry
from sessions.manager import SessionManager
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink


async def test_the_cap_holds_across_two_managers_on_one_redis(redis_url: str) -> None:
    # Two managers with their own connections stand for two server processes.
    r1, r2 = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    sinks = [ClockedSink() for _ in range(5)]
    try:
        async with (
            SessionManager(r1, EnginePipeline(FakeEngine()), max_sessions=3) as a,
            SessionManager(r2, EnginePipeline(FakeEngine()), max_sessions=3) as b,
        ):
            s1 = await a.create(sinks[0])
            await b.create(sinks[1])
            await a.create(sinks[2])
            with pytest.raises(SessionLimitError, match="all 3 session slots"):
                await b.create(sinks[3])
            with pytest.raises(SessionLimitError):
                await a.create(sinks[3])
            # Concurrent attempts for the last slot: exactly one wins.
            await a.close_session(s1.session_id)
            results = await asyncio.gather(
                a.create(sinks[3]), b.create(sinks[4]), return_exceptions=True
            )
            assert sum(isinstance(r, SessionLimitError) for r in results) == 1
            assert await a.leases.count() == 3
            assert len(a) + len(b) == 3
    finally:
        await r1.aclose()
        await r2.aclose()


async def test_a_dead_process_frees_its_slots_after_the_lease_ttl(redis: aioredis.Redis) -> None:
    leases = LeaseRegistry(redis, cap=1, ttl_s=0.3)
    assert await leases.acquire("sess_crashed")  # its owner dies and never renews
    assert not await leases.acquire("sess_new")
    await asyncio.sleep(0.4)
    assert await leases.acquire("sess_new")
    await leases.release("sess_new")
    assert await redis.keys("*") == []


async def test_shutdown_says_goodbye_to_every_session(redis: aioredis.Redis) -> None:
    sinks = [ClockedSink(), ClockedSink()]
    manager = SessionManager(redis, EnginePipeline(FakeEngine()))
    async with manager:
        sessions = [await manager.create(sink) for sink in sinks]
        with pytest.raises(SessionNotFoundError):
            manager.get("sess_nope")
        assert manager.get(sessions[0].session_id) is sessions[0]
    await manager.close()  # idempotent
    for sink in sinks:
        goodbye = sink.events[-1]
        assert isinstance(goodbye, SessionClosed) and goodbye.reason == "server_shutdown"
    with pytest.raises(SessionLimitError, match="shutting down"):
        await manager.create(ClockedSink())
    assert await redis.keys("*") == []


async def test_a_lease_renewed_as_its_session_ends_is_not_left_behind(
    redis: aioredis.Redis,
) -> None:
    """The manager renews every live session's lease now and then. A session that ends
    while its renewal is on its way to Redis is released after it, not before: a renewal
    arriving last would take the slot again and hold it for nobody until the lease's TTL
    (three such slots were left after a churn of 270 sessions)."""
    manager = SessionManager(redis, EnginePipeline(FakeEngine()))
    async with manager:
        session = await manager.create(ClockedSink())
        renew, sent, answer = manager.leases.renew, asyncio.Event(), asyncio.Event()

        async def slow_renew(session_id: str) -> bool:
            sent.set()
            await answer.wait()  # on its way to Redis
            return await renew(session_id)

        manager.leases.renew = slow_renew  # type: ignore[method-assign]
        renewing = asyncio.create_task(manager._renew(session))
        await sent.wait()
        closing = asyncio.create_task(manager.close_session(session.session_id))
        await asyncio.sleep(0.2)  # the session has ended; its release waits for the renewal
        answer.set()
        await asyncio.gather(renewing, closing)
        assert await manager.leases.count() == 0
        await manager._renew(session)  # a later round finds it gone and renews nothing
        assert await manager.leases.count() == 0
