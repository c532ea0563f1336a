"""Conversation history in Redis: committed items, in order.

Items live in a hash (id -> JSON) with their order in a list, so an item can be updated
in place (an assistant answer truncated by barge-in) or deleted without rewriting the rest.
The history is bounded: past `max_items` the oldest items are dropped and counted.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from .events import ConversationItem
from .keys import DEFAULT_KEY_TTL_S, SessionKeys
from .records import item_from_json, item_to_json

DEFAULT_MAX_ITEMS = 1_000


class History:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: SessionKeys,
        max_items: int = DEFAULT_MAX_ITEMS,
        ttl_s: int = DEFAULT_KEY_TTL_S,
    ) -> None:
        self._redis = redis
        self._order = keys.history
        self._items = keys.items
        self._ttl_s = ttl_s
        self.max_items = max_items
        self.dropped = 0

    async def append(self, item: ConversationItem) -> str | None:
        """Commit `item` at the end; returns the id of the item before it, if any."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.lindex(self._order, -1)
        pipe.hset(self._items, item.id, item_to_json(item))
        pipe.rpush(self._order, item.id)
        pipe.expire(self._order, self._ttl_s)
        pipe.expire(self._items, self._ttl_s)
        previous, _, length, _, _ = await pipe.execute()
        if int(length) > self.max_items:
            await self._drop_oldest(int(length) - self.max_items)
        return previous.decode() if previous else None

    async def _drop_oldest(self, count: int) -> None:
        old = await self._redis.lpop(self._order, count)
        if old:
            await self._redis.hdel(self._items, *old)
            self.dropped += len(old)

    async def update(self, item: ConversationItem) -> bool:
        """Replace a committed item; False if it is not in the history."""
        if not await self._redis.hexists(self._items, item.id):
            return False
        await self._redis.hset(self._items, item.id, item_to_json(item))
        return True

    async def get(self, item_id: str) -> ConversationItem | None:
        raw = await self._redis.hget(self._items, item_id)
        return item_from_json(raw) if raw else None

    async def delete(self, item_id: str) -> bool:
        pipe = self._redis.pipeline(transaction=True)
        pipe.lrem(self._order, 1, item_id)
        pipe.hdel(self._items, item_id)
        removed, _ = await pipe.execute()
        return bool(removed)

    async def last_id(self) -> str | None:
        raw = await self._redis.lindex(self._order, -1)
        return raw.decode() if raw else None

    async def items(self) -> list[ConversationItem]:
        ids = await self._redis.lrange(self._order, 0, -1)
        if not ids:
            return []
        raws = await self._redis.hmget(self._items, ids)
        return [item_from_json(raw) for raw in raws if raw]
