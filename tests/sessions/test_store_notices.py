"""What a client is told when the session store cannot take writes: once an episode each.
The episodes are declared on the link here; the real ones are in test_redis_outage.py and
test_redis_oom.py."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from sessions.redis_link import RedisLink
from sessions.store_notices import StoreNotices


async def test_each_notice_is_given_once_an_episode(redis: aioredis.Redis) -> None:
    link = RedisLink(redis)
    notices = StoreNotices(link, spill_max_bytes=2 * 1024 * 1024)
    assert notices.outage(0) is None and notices.refusal(0) is None

    link.went_down(ConnectionError("test outage"))
    told = notices.outage(link.outages)
    assert told is not None and told.code == "redis_unavailable" and "2 MiB" in told.message
    assert notices.outage(link.outages) is None
    lost = notices.dropped("audio")
    assert lost is not None and lost.code == "redis_writes_dropped"
    assert "still unreachable" in lost.message and "input audio" in lost.message
    assert notices.dropped("frames") is None  # the same outage
    link.came_back()

    link.refused(OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))
    full = notices.refusal(link.refusals)
    assert full is not None and full.code == "redis_full" and "full" in full.message
    assert full.error_type == "server_error"
    assert notices.refusal(link.refusals) is None
    lost = notices.dropped("events")
    assert lost is not None and "still refuses writes" in lost.message
    assert "events of the resume log" in lost.message
    assert notices.dropped("events") is None

    # A write back refused again is the same refusal; one after it was over is a new one.
    link.accepts_writes()
    link.refused(OutOfMemoryError("again"))
    assert link.refusals == 1 and notices.refusal(link.refusals) is None
    link.accepts_writes()
    link.refusal_over()
    link.refused(OutOfMemoryError("later"))
    assert link.refusals == 2 and notices.refusal(link.refusals) is not None
