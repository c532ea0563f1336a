"""RedisLink.call delivers a cancel that the Redis client swallowed; its watch outlives odd
errors.

On Python 3.11, redis-py wraps each socket write in `asyncio.wait_for`, which returns the
write's result instead of raising when a cancel lands just as the write completes. A
session that cancels its event-log writer at that moment then waited forever in `close()`,
holding its session slot until shutdown (issue 8: a WebRTC call closed right after it was
set up). The link re-raises such a cancel once the call returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import cast

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, SlotNotCoveredError

from sessions.redis_link import RedisLink


async def test_a_cancel_the_client_swallowed_still_cancels_the_caller(
    redis: aioredis.Redis,
) -> None:
    link = RedisLink(redis)
    started = asyncio.Event()

    async def swallowing_call() -> str:
        started.set()
        # What wait_for does when its inner future is already done:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        return "written"

    task = asyncio.create_task(link.call(swallowing_call))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_call_returns_its_result(redis: aioredis.Redis) -> None:
    link = RedisLink(redis)
    assert await link.call(lambda: redis.ping()) is True


class Flaky:
    """A real client whose `ping` raises the errors given first, one a call."""

    def __init__(self, redis: aioredis.Redis, errors: list[BaseException]) -> None:
        self.redis = redis
        self.errors = errors

    async def ping(self) -> bool:
        if self.errors:
            raise self.errors.pop(0)
        return bool(await self.redis.ping())


def watched(client: Flaky) -> RedisLink:
    return RedisLink(cast(aioredis.Redis, client), probe_interval_s=0.01, heartbeat_interval_s=0.01)


async def ride_out_an_outage(link: RedisLink) -> None:
    """An outage begins, and the link's watch runs until it ends."""
    link.went_down(RedisConnectionError("Connection closed by server."))
    async with asyncio.TaskGroup() as tasks:
        watch = tasks.create_task(link.run())
        async with asyncio.timeout(5):
            await link.wait_up()
        watch.cancel()


async def test_an_outage_ends_even_when_the_probe_meets_errors_of_its_own(
    redis: aioredis.Redis,
) -> None:
    """redis-py's cluster client raises its own errors, no RedisError, while a node rejoins
    (its slot map is in flux). The probe counts them as "not back yet" and probes on; the
    outage ends when Redis answers, so the sessions' kept writes go back to Redis."""
    client = Flaky(
        redis,
        [
            RedisClusterException("All slots are not covered after query all startup_nodes."),
            SlotNotCoveredError('Slot "42" not covered by the cluster.'),
            RedisConnectionError("Connection refused"),
        ],
    )
    link = watched(client)
    await ride_out_an_outage(link)
    assert not client.errors and link.outages == 1


async def test_an_outage_ends_even_when_the_client_raises_a_cancel_nobody_asked_for(
    redis: aioredis.Redis,
) -> None:
    """A client library may raise CancelledError of its own (a future of a connection it
    dropped) though nobody cancelled the watch; were the watch to end on it, nothing would
    probe again and the sessions would keep their writes locally for good."""
    client = Flaky(redis, [RedisConnectionError("Connection refused"), asyncio.CancelledError()])
    link = watched(client)
    await ride_out_an_outage(link)
    assert not client.errors and "CancelledError" in link.stats.probe_errors


async def test_the_heartbeat_outlives_an_error_that_is_no_outage(
    redis: aioredis.Redis,
) -> None:
    """An odd error on one heartbeat is logged, and the next outage is still noticed."""
    client = Flaky(redis, [RedisClusterException("No targets were found to execute PING")])
    link = watched(client)
    async with asyncio.TaskGroup() as tasks:
        watch = tasks.create_task(link.run())
        async with asyncio.timeout(5):
            while client.errors:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # heartbeats go on
            client.errors.append(RedisConnectionError("Connection refused"))
            assert await link.next_outage(0) == 1
            await link.wait_up()
        watch.cancel()


class Wedged(Flaky):
    """A client whose every probe fails until its connections are dialled afresh."""

    def __init__(self, redis: aioredis.Redis) -> None:
        super().__init__(redis, [])
        self.redials = 0

    async def ping(self) -> bool:
        if not self.redials:
            raise RedisConnectionError("Connection closed by server.")
        return await super().ping()

    async def reset_connections(self) -> None:
        self.redials += 1


async def test_a_client_wedged_past_the_outage_is_dialled_afresh(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A probe that fails on and on (a cluster client left wedged by a node's death, once
    seen in CI after every node was back) has the client drop its connections, and the
    outage ends at the next probe. The log says the outage goes on, and why."""
    monkeypatch.setattr("sessions.redis_link.REDIAL_AFTER_S", 0.1)
    client = Wedged(redis)
    link = watched(client)
    await ride_out_an_outage(link)
    assert client.redials == 1 and link.outages == 1
    (still,) = [r.getMessage() for r in caplog.records if "still unreachable" in r.getMessage()]
    assert "Connection closed by server" in still


class HangsOnFirstRedial(Wedged):
    """A wedged client whose first redial never returns (its connections will not close)."""

    attempts = 0

    async def reset_connections(self) -> None:
        self.attempts += 1
        if self.attempts == 1:
            await asyncio.Event().wait()
        self.redials += 1  # done: the probes get through from now on


async def test_a_redial_that_hangs_is_given_up_and_tried_again(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch bounds a redial like any call: one that hangs is dropped at the call
    timeout, the probes go on, and the next redial ends the outage."""
    monkeypatch.setattr("sessions.redis_link.REDIAL_AFTER_S", 0.1)
    client = HangsOnFirstRedial(redis)
    link = RedisLink(
        cast(aioredis.Redis, client),
        probe_interval_s=0.01,
        heartbeat_interval_s=0.01,
        call_timeout_s=0.2,
    )
    await ride_out_an_outage(link)
    assert client.attempts == 2 and client.redials == 1 and link.outages == 1
