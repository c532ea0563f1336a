"""Who owns a session, with a fencing token, so any process can take any session over.

The owner and the fence live in the session record (the `meta` hash: fields `owner` and
`fence`), so they share the session's hash tag and every script here touches one slot
(Redis Cluster). The fence only ever grows (HINCRBY): a create claims it, a resume on
another process takes it over, a hand-over gives it up (owner cleared, fence bumped). A
process that lost the fence must not write over the new owner's state: before its
teardown writes it asks `owns()`, and its key deletion is fenced in Redis itself
(`delete_if_owner`), so a late teardown of an old owner never deletes a live session.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from .keys import SessionKeys

_CLAIM = """
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return fence
"""

_TAKE_OVER = """
if redis.call('HEXISTS', KEYS[1], 'resume_token') == 0 then
  return {0, ''}
end
local previous = redis.call('HGET', KEYS[1], 'owner') or ''
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1])
return {fence, previous}
"""

_RELEASE = """
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then
  return 0
end
redis.call('HDEL', KEYS[1], 'owner')
redis.call('HINCRBY', KEYS[1], 'fence', 1)
return 1
"""

_DELETE_IF_OWNER = """
local fence = redis.call('HGET', KEYS[1], 'fence')
if fence and fence ~= ARGV[1] then
  return 0
end
redis.call('DEL', unpack(KEYS))
return 1
"""


@dataclass(frozen=True, slots=True)
class Takeover:
    fence: int
    """The new owner's fence; 0 when there was no session record to take over."""
    previous_owner: str
    """The process that owned the session before ('' when none did)."""


class Ownership:
    """The ownership scripts of every session, for one process."""

    def __init__(self, redis: aioredis.Redis, process_id: str) -> None:
        self.process_id = process_id
        self._redis = redis
        self._claim = redis.register_script(_CLAIM)
        self._take_over = redis.register_script(_TAKE_OVER)
        self._release = redis.register_script(_RELEASE)

    async def claim(self, session_id: str, ttl_s: int) -> int:
        """A new session: this process owns it; returns its fence."""
        meta = SessionKeys(session_id).meta
        return int(await self._claim(keys=[meta], args=[self.process_id, ttl_s]))

    async def take_over(self, session_id: str) -> Takeover:
        """A resume here: this process owns the session from now on, whoever did before."""
        meta = SessionKeys(session_id).meta
        fence, previous = await self._take_over(keys=[meta], args=[self.process_id])
        owner = previous.decode() if isinstance(previous, bytes) else str(previous)
        return Takeover(int(fence), owner)

    async def release(self, session_id: str, fence: int) -> bool:
        """Let the session go (a hand-over): nobody owns it, the next resume takes it at
        once. False when another process took it over already."""
        meta = SessionKeys(session_id).meta
        return int(await self._release(keys=[meta], args=[fence])) == 1

    async def owner(self, session_id: str) -> str | None:
        """The process that owns the session now (None: nobody, or no such session)."""
        owner = await self._redis.hget(SessionKeys(session_id).meta, "owner")
        if owner is None:
            return None
        return owner.decode() if isinstance(owner, bytes) else str(owner)

    async def owns(self, session_id: str, fence: int) -> bool:
        """Whether `fence` is still the session's (or its record is gone)."""
        current = await self._redis.hget(SessionKeys(session_id).meta, "fence")
        return current is None or int(current) == fence


def delete_script(redis: aioredis.Redis) -> AsyncScript:
    """The fenced deletion of a session's keys: KEYS = meta first, then the rest; ARGV =
    the deleting owner's fence. Returns 1 when deleted, 0 when another owner holds it."""
    return redis.register_script(_DELETE_IF_OWNER)
