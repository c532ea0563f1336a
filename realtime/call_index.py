"""Which server process holds each live call: how a sideband finds a call on another worker.

A sideband names a call by its id (a WebRTC call's `rtc_...`, a SIP call's Call-ID or the
id OpenAI's SIP flow gave the app), and a call lives in the process whose peer connection
or RTP sockets carry it: it cannot move. With `--workers N` the sideband's WebSocket may
land on another worker, which looks the call's process up here: one small key per call,
`parley:call:<call id>` -> the process id, with a TTL (a process that dies leaves nothing
that outlives `TTL_S`).

A process keeps its calls' keys by syncing them with the calls it holds (`run`, every
`SYNC_S`): a new call's key is set, an ended call's deleted, every key's expiry pushed out
every `RENEW_S`; a new WebRTC call is added at once (`add`, before its answer goes out), so
a sideband opened as soon as the client has the call's id finds it. A key that outlives its
call (an end not synced yet) names a process that no longer has the call: that process
answers `missing` and the sideband is refused, as an unknown call is. A Redis outage only
delays the sync; the calls themselves never wait on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sessions.keys import NAMESPACE

log = logging.getLogger("parley.realtime.call_index")

TTL_S = 60
SYNC_S = 0.5
RENEW_S = TTL_S / 3
WRITE_S = 2.0
"""How long one write may take; past it the next sync tries again."""


def call_key(call_id: str, namespace: str = NAMESPACE) -> str:
    return f"{namespace}:call:{call_id}"


class CallIndex:
    def __init__(self, redis: aioredis.Redis, process_id: str) -> None:
        self._redis = redis
        self.process_id = process_id
        self._indexed: set[str] = set()
        """The call ids whose keys this process has set (and not deleted)."""

    async def owner(self, call_id: str) -> str | None:
        """The process that holds `call_id`, if any process has said so."""
        owner = await self._redis.get(call_key(call_id))
        if owner is None:
            return None
        return owner.decode() if isinstance(owner, bytes) else str(owner)

    async def add(self, call_ids: Iterable[str]) -> None:
        """Say at once that this process holds `call_ids` (never raises: the next sync
        tries again)."""
        new = [call_id for call_id in call_ids if call_id not in self._indexed]
        if new:
            await self._write(new, [])

    async def sync(self, local: set[str], *, renew: bool = False) -> None:
        """Make the keys say what `local` (this process's call ids) says; `renew`: push
        every key's expiry out too."""
        new = local if renew else local - self._indexed
        gone = self._indexed - local
        if new or gone:
            await self._write(list(new), list(gone))

    async def run(self, local: Callable[[], set[str]]) -> None:
        """Sync with `local()` until cancelled (the app's lifespan owns this task)."""
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while True:
            renew = loop.time() - renewed >= RENEW_S
            if renew:
                renewed = loop.time()
            await self.sync(local(), renew=renew)
            await asyncio.sleep(SYNC_S)

    async def close(self) -> None:
        """Delete this process's keys (its calls have ended, or are ending with it)."""
        await self.sync(set())

    async def _write(self, set_ids: list[str], delete_ids: list[str]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for call_id in set_ids:
            pipe.set(call_key(call_id), self.process_id, ex=TTL_S)
        for call_id in delete_ids:
            pipe.delete(call_key(call_id))
        try:
            async with asyncio.timeout(WRITE_S):
                await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            log.debug("call index: %d keys not written: %s", len(set_ids) + len(delete_ids), exc)
            return
        self._indexed.update(set_ids)
        self._indexed.difference_update(delete_ids)
