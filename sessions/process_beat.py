"""A server process's heartbeat and its mailbox, so other processes can find it and ask it.

Every process (its SessionManager) sets `parley:process:<id>` with a short TTL
(`TTL_S`) and renews it every `INTERVAL_S`: a process whose key is gone is dead (killed,
or cut off from Redis) and its sessions may be taken over at once. Requests from other
processes arrive on the Redis pub/sub channel of the same name (pub/sub leaves no keys
behind and reaches every node of a Redis Cluster); a request names the channel to answer
on and its id, and the answer is a message on that channel once the request is done
(`tell()` sends one that answers on a channel of its own, and gets no such answer).
`ask()` waits for the answer a bounded time: a live but silent process is not waited for
longer. A clean stop deletes the heartbeat key. While the session store is unreachable
(the manager's RedisLink says so) the process neither beats nor listens: it is
taken for dead meanwhile, which it is for the other processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from pipeline.tasks import TaskSet, background, cancel_and_wait

from .keys import NAMESPACE
from .redis_link import RedisLink

log = logging.getLogger("parley.sessions.process_beat")

TTL_S = 3.0
INTERVAL_S = 1.0
RETRY_S = 0.5
STOP_DELETE_S = 2.0
"""How long a clean stop waits to delete its heartbeat key; past it the key's TTL does."""

Request = dict[str, Any]
Handler = Callable[[Request], Awaitable[None]]


def new_process_id() -> str:
    return f"proc_{secrets.token_hex(6)}"


def process_key(process_id: str, namespace: str = NAMESPACE) -> str:
    """The heartbeat key of a process, and the name of its request channel."""
    return f"{namespace}:process:{process_id}"


class ProcessBeat:
    def __init__(
        self,
        redis: aioredis.Redis,
        process_id: str,
        handler: Handler,
        link: RedisLink | None = None,
    ) -> None:
        self.process_id = process_id
        self._link = link or RedisLink(redis)
        self.key = process_key(process_id)
        self._redis = redis
        self._handler = handler
        self._tasks: list[asyncio.Task[None]] = []
        self._handling = TaskSet(f"{process_id}:requests")
        """Owns the requests being handled; `stop` closes it (`start` opens a new one)."""
        self._answers: dict[str, asyncio.Future[None]] = {}
        self._listening = asyncio.Event()

    def start(self) -> None:
        """Start beating and listening (tasks owned here until `stop`)."""
        if self._handling.closed:  # started again after a stop
            self._handling = TaskSet(self._handling.name)
        self._tasks = [
            background(self._beat(), f"{self.process_id}:beat"),
            background(self._listen(), f"{self.process_id}:mailbox"),
        ]

    async def listening(self) -> None:
        """Return once the mailbox is subscribed."""
        await self._listening.wait()

    async def stop(self, *, clean: bool = True) -> None:
        """Stop beating and listening; `clean`: delete the heartbeat key too (a process
        that says so is not taken for dead meanwhile)."""
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)
        await self._handling.close()
        for answer in self._answers.values():
            answer.cancel()
        if clean:  # bounded: a store that hangs must not hold a shutdown (the key expires)
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(STOP_DELETE_S):
                    await self._redis.delete(self.key)

    async def alive(self, process_id: str) -> bool:
        return bool(await self._redis.exists(process_key(process_id)))

    async def ask(self, process_id: str, request: Request, timeout_s: float) -> bool:
        """Send `request` to another process and wait up to `timeout_s` for its answer;
        False when it did not answer in time (or nobody listens on its channel)."""
        request_id = secrets.token_hex(8)
        answer = asyncio.get_running_loop().create_future()
        self._answers[request_id] = answer
        body = {**request, "request_id": request_id, "reply_to": self.key}
        try:
            async with asyncio.timeout(timeout_s):
                if not await self._redis.publish(process_key(process_id), json.dumps(body)):
                    return False
                await answer
                return True
        except TimeoutError:
            return False
        finally:
            self._answers.pop(request_id, None)

    async def tell(self, process_id: str, request: Request) -> bool:
        """Send `request` to another process without waiting for it to be done (a request
        that answers on a channel of its own); False when nobody listens on its channel."""
        body = {**request, "request_id": secrets.token_hex(8)}
        return bool(await self._redis.publish(process_key(process_id), json.dumps(body)))

    async def _beat(self) -> None:
        while True:
            if self._link.up:
                try:
                    await self._redis.set(self.key, "1", px=int(TTL_S * 1000))
                except (RedisError, OSError) as exc:
                    log.debug("process %s: heartbeat failed: %s", self.process_id, exc)
            await asyncio.sleep(INTERVAL_S)

    async def _listen(self) -> None:
        while True:
            await self._link.wait_up()
            pubsub: PubSub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.key)
                self._listening.set()
                while True:
                    message = await pubsub.get_message(timeout=INTERVAL_S)
                    if message is not None and message.get("type") == "message":
                        self._received(message["data"])
            except (RedisError, OSError) as exc:
                log.debug("process %s: mailbox failed: %s", self.process_id, exc)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
            await asyncio.sleep(RETRY_S)

    def _received(self, data: bytes | str) -> None:
        try:
            body = json.loads(data)
        except ValueError:
            log.warning("process %s: unreadable request %r", self.process_id, data[:80])
            return
        if body.get("op") == "answer":
            answer = self._answers.get(str(body.get("request_id")))
            if answer is not None and not answer.done():
                answer.set_result(None)
            return
        if not self._handling.closed:  # stopping: the asker's wait times out
            self._handling.create_task(self._handle(body), name=f"{self.process_id}:request")

    async def _handle(self, body: Request) -> None:
        try:
            await self._handler(body)
        except Exception:
            log.exception("process %s: request %s failed", self.process_id, body.get("op"))
        if "reply_to" not in body:  # told, not asked
            return
        reply = {"op": "answer", "request_id": body.get("request_id")}
        with contextlib.suppress(RedisError, OSError):
            await self._redis.publish(str(body.get("reply_to")), json.dumps(reply))
