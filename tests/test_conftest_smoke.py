import redis.asyncio as aioredis


async def test_redis_fixture_answers(redis: aioredis.Redis) -> None:
    assert await redis.ping()
