"""Per-caller limits on a real Redis: sessions held at once, sessions started per minute,
across two managers, and nothing left behind."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from sessions.errors import KeyLimitError, SessionLimitError
from sessions.key_limits import KeyLimiter, KeyLimits
from sessions.keys import SessionKeys, caller_keys
from sessions.manager import SessionManager
from sessions.session import SessionLimits
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink

ALICE, BOB = "key:alice", "key:bob"


async def test_a_caller_at_its_limit_is_refused_while_another_gets_in(
    redis: aioredis.Redis,
) -> None:
    limiter = KeyLimiter(redis, KeyLimits(max_sessions=2))
    await limiter.acquire(ALICE, "sess_1")
    await limiter.acquire(ALICE, "sess_2")
    await limiter.acquire(ALICE, "sess_2")  # a held id is taken again, not twice
    with pytest.raises(KeyLimitError, match="holds 2 sessions") as refused:
        await limiter.acquire(ALICE, "sess_3")
    assert refused.value.code == "rate_limit_exceeded" and refused.value.retry_after_s is None
    with pytest.raises(KeyLimitError):
        await limiter.check(ALICE)
    await limiter.check(BOB)
    await limiter.acquire(BOB, "sess_4")
    await limiter.renew(ALICE, "sess_5")  # a resumed session is counted, even over the limit
    assert await limiter.count(ALICE) == 3
    for session_id in ("sess_1", "sess_2", "sess_5"):
        await limiter.release(ALICE, session_id)
    await limiter.check(ALICE)
    await limiter.release(BOB, "sess_4")
    assert await redis.keys("*") == []


async def test_a_dead_process_frees_a_callers_slots_after_the_ttl(redis: aioredis.Redis) -> None:
    limiter = KeyLimiter(redis, KeyLimits(max_sessions=1), ttl_s=0.3)
    await limiter.acquire(ALICE, "sess_crashed")  # its owner dies and never renews
    with pytest.raises(KeyLimitError):
        await limiter.acquire(ALICE, "sess_new")
    await asyncio.sleep(0.4)
    await limiter.acquire(ALICE, "sess_new")
    await limiter.release(ALICE, "sess_new")
    assert await redis.keys("*") == []


async def test_the_rate_limit_refuses_a_burst_and_allows_again_after_the_window(
    redis: aioredis.Redis,
) -> None:
    # 120 per minute: 120 at once, then one every 0.5 s.
    limiter = KeyLimiter(redis, KeyLimits(max_sessions=1000, per_minute=120))
    for n in range(120):
        await limiter.acquire(ALICE, f"sess_{n}")
    with pytest.raises(KeyLimitError, match="120 sessions per minute") as refused:
        await limiter.acquire(ALICE, "sess_over")
    retry = refused.value.retry_after_s
    assert retry is not None and 0.3 < retry <= 0.5
    with pytest.raises(KeyLimitError):
        await limiter.check(ALICE)
    await limiter.acquire(BOB, "sess_bob")  # another caller has its own bucket
    await asyncio.sleep(retry + 0.02)
    await limiter.acquire(ALICE, "sess_later")
    with pytest.raises(KeyLimitError):
        await limiter.acquire(ALICE, "sess_again")  # one token came back, and went
    for n in [*range(120), "later"]:
        await limiter.release(ALICE, f"sess_{n}")
    await limiter.release(BOB, "sess_bob")
    # the rate state expires once the bucket would be full again: nothing stays
    rate_key = caller_keys(ALICE)[1]
    assert 0 < await redis.pttl(rate_key) <= 60_000
    await redis.delete(rate_key, caller_keys(BOB)[1])
    assert await redis.keys("*") == []


async def test_a_refill_that_empties_the_bucket_leaves_no_key(redis: aioredis.Redis) -> None:
    limiter = KeyLimiter(redis, KeyLimits(max_sessions=5, per_minute=1200))  # 0.05 s each
    await limiter.acquire(ALICE, "sess_1")
    await limiter.release(ALICE, "sess_1")
    await asyncio.sleep(0.1)
    assert await redis.keys("*") == []


async def test_two_managers_on_one_redis_enforce_one_limit_per_caller(redis_url: str) -> None:
    # Two managers with their own connections stand for two server processes.
    r1, r2 = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    limits = KeyLimits(max_sessions=2)
    try:
        async with (
            SessionManager(r1, EnginePipeline(FakeEngine()), key_limits=limits) as a,
            SessionManager(r2, EnginePipeline(FakeEngine()), key_limits=limits) as b,
        ):
            first = await a.create(ClockedSink(), caller=ALICE)
            await b.create(ClockedSink(), caller=ALICE)
            for manager in (a, b):
                with pytest.raises(KeyLimitError):
                    await manager.create(ClockedSink(), caller=ALICE)
            rejections = a.metrics.registry.get_sample_value("parley_key_limit_rejections_total")
            assert rejections == 1
            assert await a.leases.count() == 2  # a refused session took no slot of the cap
            await b.create(ClockedSink(), caller=BOB)
            await a.create(ClockedSink())  # no caller: only the cap counts
            # A slot frees when a session ends; concurrent attempts for it: one wins.
            await a.close_session(first.session_id)
            results = await asyncio.gather(
                a.create(ClockedSink(), caller=ALICE),
                b.create(ClockedSink(), caller=ALICE),
                return_exceptions=True,
            )
            assert sum(isinstance(r, KeyLimitError) for r in results) == 1
            assert await a.key_limits.count(ALICE) == 2
            # the upkeep's renewal keeps the slots of live sessions
            for session in a.sessions():
                await a._renew(session)
            assert await a.key_limits.count(ALICE) + await a.key_limits.count(BOB) == 3
        assert await r1.keys("*") == []
    finally:
        await r1.aclose()
        await r2.aclose()


async def test_the_cap_still_refuses_first_with_a_session_limit(redis: aioredis.Redis) -> None:
    async with SessionManager(
        redis, EnginePipeline(FakeEngine()), max_sessions=1, key_limits=KeyLimits(5)
    ) as manager:
        await manager.create(ClockedSink(), caller=ALICE)
        with pytest.raises(SessionLimitError) as refused:
            await manager.create(ClockedSink(), caller=BOB)
        assert not isinstance(refused.value, KeyLimitError)
    assert await redis.keys("*") == []


async def test_a_resumed_session_counts_against_its_caller_on_the_new_manager(
    redis: aioredis.Redis,
) -> None:
    limits, quick = KeyLimits(max_sessions=1), SessionLimits(watchdog_interval_s=0.05)

    def manager(process_id: str) -> SessionManager:
        pipeline = EnginePipeline(FakeEngine())
        return SessionManager(
            redis, pipeline, key_limits=limits, limits=quick, process_id=process_id
        )

    async with manager("proc_a") as a, manager("proc_b") as b, ClockedSink() as sink:
        await a.beat.listening()
        await b.beat.listening()
        session = await a.create(sink, caller=ALICE)
        await sink.wait_for(lambda e: e.type == "session.created")
        async with asyncio.timeout(5):  # its record is written behind session.created
            while not await redis.exists(SessionKeys(session.session_id).meta):
                await asyncio.sleep(0.02)
        moved = await b.resume(session.session_id, session.resume_token, caller=ALICE)
        assert moved is not None and len(a) == 0
        # the old copy freed its slot as it let go; the new one took it again
        assert await b.key_limits.count(ALICE) == 1
        with pytest.raises(KeyLimitError):
            await a.create(ClockedSink(), caller=ALICE)
        await b.close_session(moved.session_id)
        assert await b.key_limits.count(ALICE) == 0
    assert await redis.keys("*") == []


async def test_a_rate_limit_alone_keeps_no_session_slots(redis: aioredis.Redis) -> None:
    limiter = KeyLimiter(redis, KeyLimits(per_minute=1200))  # one every 0.05 s
    await limiter.acquire(ALICE, "sess_1")
    await limiter.renew(ALICE, "sess_1")
    assert await redis.keys("*") == [caller_keys(ALICE)[1].encode()]
    await limiter.release(ALICE, "sess_1")
    await asyncio.sleep(0.1)
    assert await redis.keys("*") == []


async def test_with_no_limits_a_caller_costs_nothing_in_redis(redis: aioredis.Redis) -> None:
    async with SessionManager(redis, EnginePipeline(FakeEngine())) as manager:
        for _ in range(3):
            await manager.create(ClockedSink(), caller=ALICE)
        await manager.check_caller(ALICE)
        assert not any(b"caller" in key for key in await redis.keys("*"))
    assert await redis.keys("*") == []
