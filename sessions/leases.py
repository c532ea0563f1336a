"""Session admission with atomic Redis leases, shared by every server process.

A sorted set holds session ids scored by lease expiry (Redis server time). One Lua script
expires stale leases, checks the cap and takes a slot in one step, so two processes can
never both take the last slot. A process that dies stops renewing; its slots free
themselves after `ttl_s`.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from .keys import NAMESPACE, leases_key

_ACQUIRE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if (not held) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return -1
end
redis.call('ZADD', KEYS[1], t + ttl, ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 1)
return 1
"""


class LeaseRegistry:
    def __init__(
        self,
        redis: aioredis.Redis,
        cap: int,
        ttl_s: float = 30.0,
        namespace: str = NAMESPACE,
    ) -> None:
        if cap < 1:
            raise ValueError("the session cap must be at least 1")
        self._redis = redis
        self.cap = cap
        self.ttl_s = ttl_s
        self.key = leases_key(namespace)
        self._script = redis.register_script(_ACQUIRE)

    async def acquire(self, session_id: str) -> bool:
        """Take a slot for `session_id`; False when the cap is reached."""
        result = await self._script(keys=[self.key], args=[session_id, self.cap, self.ttl_s])
        return int(result) == 1

    async def renew(self, session_id: str) -> bool:
        """Extend a held lease (re-taking it if it lapsed); False if it lapsed and the cap
        is now full, in which case the live session goes on uncounted."""
        return await self.acquire(session_id)

    async def release(self, session_id: str) -> None:
        await self._redis.zrem(self.key, session_id)

    async def count(self) -> int:
        return int(await self._redis.zcard(self.key))
