"""A stage on another host, reached through Redis streams.

The main process holds a `RemoteEngine`; the other host runs `parley stage`, which serves
the stage's engine over the other end of the same link (named in the graph file, so both
sides agree). The remote side announces itself with `Ready` whenever it starts; requests
wait for it up to the start timeout.

A Redis link cannot see a peer vanish, so the remote side says `Alive` every `HEARTBEAT_S`
and the main side marks the stage down after `LIVENESS_S` without a word: requests in flight
fail at once (not at the session's 30 s chunk deadline) and new ones fail fast until the
stage speaks again. A Redis outage is ridden out by both sides: the main side marks the
stage down, the remote side drops its requests in flight, and once Redis answers the remote
side says `Ready` again. A stage killed and started again announces itself the same way.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from .connectors.base import LinkClosed, LinkUnavailable
from .connectors.redis_client import open_redis
from .connectors.redis_streams import RedisStreamLink
from .link_messages import Alive, Fatal, Ready
from .stage_client import RETRY_S, LinkedStage
from .tasks import TaskSet

log = logging.getLogger("parley.pipeline.remote")

HEARTBEAT_S = 1.0
LIVENESS_S = 3.0
"""Three heartbeats missed: the stage is down."""
SOCKET_TIMEOUT_S = 5.0
"""Above the link's 1 s blocking read; a Redis that stops answering fails reads after this."""


async def link_redis(url: str) -> aioredis.Redis:
    return await open_redis(
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
    )


class RemoteEngine(LinkedStage):
    def __init__(
        self, stage: str, link_name: str, redis_url: str, start_timeout_s: float = 30.0
    ) -> None:
        super().__init__(stage, start_timeout_s, liveness_s=LIVENESS_S)
        self.link_name = link_name
        self.redis_url = redis_url
        self._redis: aioredis.Redis | None = None
        self._waiting = TaskSet(f"remote:{stage}")
        """Owns the wait for the remote side's `Ready`; `close()` closes it."""
        self._pending: RedisStreamLink | None = None

    async def start(self) -> None:
        """Open our end and wait (in the background) for the remote side's `Ready`."""
        self._redis = await link_redis(self.redis_url)
        link = self._pending = RedisStreamLink.end(self._redis, self.link_name, "a")
        self._waiting.create_task(self._await_ready(link), name=f"remote:{self.name}")

    async def _await_ready(self, link: RedisStreamLink) -> None:
        """Wait for the remote side's first word: `Ready`, or `Alive` from a stage that was
        already serving when this process started."""
        try:
            while True:
                try:
                    message = await link.recv()
                except LinkUnavailable:
                    await asyncio.sleep(RETRY_S)
                    continue
                match message:
                    case Ready() | Alive():
                        self._heard_ready(message)
                        break
                    case Fatal(reason):
                        log.error("stage %s could not start on its host: %s", self.name, reason)
                    case _:
                        log.warning("stage %s: ignoring %r before ready", self.name, message)
        except LinkClosed:
            return
        log.info("stage %s: remote side is ready on link %s", self.name, self.link_name)
        self._pending = None
        self._attach(link)

    def shared_by_processes(self) -> bool:
        return True  # one `parley stage` serves every main process dialling its link

    async def close(self) -> None:
        self._closing = True
        await self._waiting.close()
        if self._pending is not None:  # the remote side never came
            await self._pending.close()
            self._pending = None
        await self._detach()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
