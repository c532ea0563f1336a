"""Conversation history: committed items, in order, in Redis and in memory.

Items live in a hash (id -> JSON) with their order in a list, so an item can be updated
in place (an assistant answer truncated by barge-in) or deleted without rewriting the rest.
The history is bounded: past `max_items` the oldest items are dropped and counted.

The session that owns the history also keeps it in memory (items are small and bounded),
and reads from there: a Redis outage cannot stop a turn from knowing its context, and after
a restart that lost the keys, `rewrite()` puts the whole history back. Writes go through
the session's spill, so those made during an outage reach Redis when it answers.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from .events import ConversationItem
from .keys import DEFAULT_KEY_TTL_S, SessionKeys
from .records import item_from_json, item_to_json
from .redis_link import RedisLink
from .spill import Spill

DEFAULT_MAX_ITEMS = 1_000


class History:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: SessionKeys,
        max_items: int = DEFAULT_MAX_ITEMS,
        ttl_s: int = DEFAULT_KEY_TTL_S,
        spill: Spill | None = None,
    ) -> None:
        self._spill = spill if spill is not None else Spill(RedisLink(redis))
        self._order_key = keys.history
        self._items_key = keys.items
        self._ttl_s = ttl_s
        self.max_items = max_items
        self.dropped = 0
        self._items: dict[str, str] = {}
        """Item id -> JSON, in order (dicts keep insertion order)."""

    async def append(self, item: ConversationItem) -> str | None:
        """Commit `item` at the end; returns the id of the item before it, if any."""
        previous = next(reversed(self._items), None)
        body = item_to_json(item)
        self._items[item.id] = body
        old: list[str] = []
        while len(self._items) > self.max_items:
            oldest = next(iter(self._items))
            del self._items[oldest]
            old.append(oldest)
        self.dropped += len(old)
        order, items, ttl = self._order_key, self._items_key, self._ttl_s

        def apply(pipe: Pipeline) -> None:
            pipe.hset(items, item.id, body)
            pipe.rpush(order, item.id)
            for oldest in old:
                pipe.lrem(order, 1, oldest)
            if old:
                pipe.hdel(items, *old)
            pipe.expire(order, ttl)
            pipe.expire(items, ttl)

        await self._spill.write("history", apply, size=len(body), values=[item.id])
        return previous

    async def insert_after(self, item: ConversationItem, previous_id: str) -> None:
        """Commit `item` right after item `previous_id` ("": at the start), as OpenAI's
        `previous_item_id` asks. KeyError if there is no such item."""
        if previous_id and previous_id not in self._items:
            raise KeyError(previous_id)
        if previous_id == next(reversed(self._items), None):
            await self.append(item)
            return
        body = item_to_json(item)
        entries = list(self._items.items())
        at = 0 if not previous_id else [k for k, _ in entries].index(previous_id) + 1
        entries.insert(at, (item.id, body))
        self._items = dict(entries)
        order, items, ttl = self._order_key, self._items_key, self._ttl_s

        def apply(pipe: Pipeline) -> None:
            pipe.hset(items, item.id, body)
            if previous_id:
                pipe.linsert(order, "AFTER", previous_id, item.id)
            else:
                pipe.lpush(order, item.id)
            pipe.expire(order, ttl)
            pipe.expire(items, ttl)

        await self._spill.write("history", apply, size=len(body), values=[item.id])
        if len(self._items) > self.max_items:  # the oldest goes, as append() would drop it
            await self.delete(next(iter(self._items)))
            self.dropped += 1

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._items

    async def update(self, item: ConversationItem) -> bool:
        """Replace a committed item; False if it is not in the history."""
        if item.id not in self._items:
            return False
        body = self._items[item.id] = item_to_json(item)
        items = self._items_key
        await self._spill.write(
            "history", lambda pipe: pipe.hset(items, item.id, body), size=len(body)
        )
        return True

    async def get(self, item_id: str) -> ConversationItem | None:
        body = self._items.get(item_id)
        return item_from_json(body) if body else None

    async def delete(self, item_id: str) -> bool:
        if self._items.pop(item_id, None) is None:
            return False
        order, items = self._order_key, self._items_key

        def apply(pipe: Pipeline) -> None:
            pipe.lrem(order, 1, item_id)
            pipe.hdel(items, item_id)

        await self._spill.write("history", apply)
        return True

    async def last_id(self) -> str | None:
        return next(reversed(self._items), None)

    async def items(self) -> list[ConversationItem]:
        return [item_from_json(body) for body in self._items.values()]

    async def load(self) -> int:
        """Read the history back from Redis (a session resumed on another process): the
        items in their order; returns how many. Raises RedisUnavailableError."""
        link = self._spill.link
        order_key, items_key = self._order_key, self._items_key
        ids = await link.call(lambda: link.redis.lrange(order_key, 0, -1))
        bodies = await link.call(lambda: link.redis.hgetall(items_key)) if ids else {}
        self._items = {}
        for raw_id in ids:
            body = bodies.get(raw_id)
            if body is not None:
                self._items[raw_id.decode()] = body.decode()
        return len(self._items)

    async def rewrite(self) -> None:
        """Write the whole history again (Redis came back empty after a restart)."""
        snapshot = dict(self._items)
        order, items, ttl = self._order_key, self._items_key, self._ttl_s

        def apply(pipe: Pipeline) -> None:
            pipe.delete(order, items)
            if snapshot:
                pipe.hset(items, mapping=snapshot)
                pipe.rpush(order, *snapshot)
                pipe.expire(order, ttl)
                pipe.expire(items, ttl)

        size = sum(len(body) for body in snapshot.values())
        await self._spill.write("history", apply, size=size, values=list(snapshot))
