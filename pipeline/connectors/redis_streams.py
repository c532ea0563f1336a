"""The Redis-streams link: a stage on another host, reached through one shared Redis.

Each direction is one stream. An entry is one message: field `h` holds the pickled header
and `b0`..`bN` hold the out-of-band array buffers as raw field values, so array data is
never pickled and the receiver builds its arrays as views onto the bytes Redis returned.

Flow control. Only this end writes its outbox and only the other end reads it. The reader
deletes each entry (XDEL) when it asks for the next one, i.e. once the caller is done with
the previous message; that deletion rides in the same round trip as the next XREAD. The
writer adds only while the stream holds fewer than `maxlen` entries, and otherwise polls
XLEN every few milliseconds. Since nobody else adds, the length the writer saw after its
own last XADD bounds the current length from above, so while that was below `maxlen` the
next send needs no check at all: one round trip per message when the reader keeps up.

Closing. An end that closes writes a close entry (`c`) after its data, so the other
side's recv drains what was sent and then raises LinkClosed, and it replaces its inbox by
a tombstone: a stream whose only entry has the id 0-1, which no XADD `*` can produce. The
other side's sends look for that id (an O(log n) range lookup that copies no payload) and
raise LinkClosed. The second end to close finds the tombstone in its outbox and deletes
both keys, so once both ends have closed no key is left. One Lua script per close makes
"has the other side closed?" and the writes that follow atomic, so two ends closing at
once still leave nothing. Every XADD refreshes its stream's TTL: an end that dies without
closing leaves keys that expire, not keys that stay. The link does not detect such a death
itself (a recv just keeps waiting); that takes a liveness signal owned by whoever runs the
stage (a remote stage's heartbeat, pipeline/remote.py). A Redis that is down or restarting
makes send and recv raise LinkUnavailable: the same end works again once Redis answers.
An end must not outlive its closed peer by more than `ttl_s`: once the tombstone has
expired, its sends fill a stream nobody reads.

Trust: messages are unpickled, so anyone who can write these keys can run code in the
reading process. The link trusts its Redis as much as the rest of the pipeline does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from .base import LinkClosed, LinkUnavailable, decode, encode

log = logging.getLogger("parley.pipeline.redis_streams")

NAMESPACE = "parley:link"
FULL_POLL_S = 0.01
"""How often a writer facing a full stream re-reads its length."""
CLOSE_TIMEOUT_S = 2.0
"""close() gives up on Redis after this long; the keys then expire by their TTL."""
TOMBSTONE_ID = "0-1"
"""The lowest legal stream id: only a closing end writes it, into a freshly deleted key."""

# KEYS[1] = this end's outbox, KEYS[2] = this end's inbox; ARGV[1] = ttl in seconds.
# Returns 1 when the other end had already closed (both keys deleted), else 0.
_CLOSE = """
if redis.call('XRANGE', KEYS[1], '0-1', '0-1')[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
redis.call('DEL', KEYS[2])
redis.call('XADD', KEYS[2], '0-1', 't', '1')
redis.call('EXPIRE', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[1], '*', 'c', '1')
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 0
"""


async def _execute(pipe: Any) -> Any:
    """Run a pipeline; a Redis that is down or restarting is LinkUnavailable (it may come
    back, and the link with it), not an error of the caller's."""
    try:
        return await pipe.execute()
    except (RedisError, OSError) as exc:
        raise LinkUnavailable(f"redis: {exc}") from exc


def link_keys(name: str, namespace: str = NAMESPACE) -> tuple[str, str]:
    """The (a-to-b, b-to-a) stream keys of the link called `name`.

    The name is a hash tag, so on a Redis Cluster both streams share a slot and the
    two-key close script stays legal (the same convention as `sessions.keys`).
    """
    return f"{namespace}:{{{name}}}:a2b", f"{namespace}:{{{name}}}:b2a"


def _stream_entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of a one-stream XREAD reply, for RESP2 (a list) or RESP3 (a dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [entry for batch in reply.values() for entry in batch[0]]
    return [entry for _key, batch in reply for entry in batch]


class RedisStreamLink:
    """One end of a link: reads `inbox_key`, writes `outbox_key`.

    The two ends must be built with the keys swapped; `end` and `pair` do that from a
    name both hosts agree on. The client must not decode responses (values are raw bytes).
    `block_ms` is how long one XREAD waits; it bounds how late a recv that is blocked on
    this end notices a close() made here, and it must stay below the client's socket
    timeout, if it has one.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        inbox_key: str,
        outbox_key: str,
        maxlen: int = 1024,
        block_ms: int = 1000,
        ttl_s: int = 300,
    ) -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be at least 1")
        if block_ms < 1:
            raise ValueError("block_ms must be at least 1 (0 would block forever)")
        if inbox_key == outbox_key:
            raise ValueError("an end cannot read and write the same stream")
        if redis.get_encoder().decode_responses:
            raise ValueError("the Redis client must be built with decode_responses=False")
        self._redis = redis
        self._inbox = inbox_key
        self._outbox = outbox_key
        self._maxlen = maxlen
        self._block_ms = block_ms
        self._ttl_s = ttl_s
        self._close_script = redis.register_script(_CLOSE)
        self._send_lock = asyncio.Lock()  # keeps the bound exact with concurrent senders
        self._recv_lock = asyncio.Lock()  # concurrent recvs would read the same entry twice
        # The outbox length after our last XADD; unknown at first, so assume full and look.
        self._outbox_len = maxlen
        self._last_id: bytes | str = "0-0"  # read from the start: nothing sent early is lost
        self._undeleted: list[bytes] = []  # consumed entries whose XDEL has not run yet
        self._closed = False
        self._peer_closed = False

    @classmethod
    def end(
        cls, redis: aioredis.Redis, name: str, side: Literal["a", "b"], **kw: int
    ) -> RedisStreamLink:
        """One end of the link `name`, for a host that builds only its own side."""
        a2b, b2a = link_keys(name)
        if side == "a":
            return cls(redis, inbox_key=b2a, outbox_key=a2b, **kw)
        return cls(redis, inbox_key=a2b, outbox_key=b2a, **kw)

    @classmethod
    def pair(
        cls, redis: aioredis.Redis, name: str, **kw: int
    ) -> tuple[RedisStreamLink, RedisStreamLink]:
        """Both ends of the link `name` (keys `parley:link:{name}:a2b` and `...:b2a`)."""
        return cls.end(redis, name, "a", **kw), cls.end(redis, name, "b", **kw)

    def _check_open(self) -> None:
        if self._closed:
            raise LinkClosed("this end of the link is closed")
        if self._peer_closed:
            raise LinkClosed("the other side closed the link")

    async def send(self, message: Any) -> None:
        """Add one message to the outbox; waits while it holds `maxlen` entries.

        A send cancelled while its XADD is in flight may or may not have been delivered.
        """
        header, buffers = encode(message)
        fields: dict[str, bytes | memoryview] = {"h": header}
        for index, buffer in enumerate(buffers):
            fields[f"b{index}"] = buffer  # redis-py writes memoryviews as they are, uncopied
        async with self._send_lock:
            await self._wait_for_room()
            pipe = self._redis.pipeline(transaction=False)
            pipe.xadd(self._outbox, fields)  # no MAXLEN: trimming would drop unread messages
            pipe.expire(self._outbox, self._ttl_s)
            pipe.xlen(self._outbox)
            pipe.xrange(self._outbox, TOMBSTONE_ID, TOMBSTONE_ID)
            _, _, length, tombstone = await _execute(pipe)
            self._outbox_len = int(length)
            if tombstone:
                # The reader closed before this entry landed: nobody will read it, and the
                # later of the two close() calls deletes it with the key.
                self._peer_closed = True
                raise LinkClosed("the other side closed the link")

    async def _wait_for_room(self) -> None:
        while True:
            self._check_open()
            if self._outbox_len < self._maxlen:
                return
            pipe = self._redis.pipeline(transaction=False)
            pipe.xlen(self._outbox)
            pipe.xrange(self._outbox, TOMBSTONE_ID, TOMBSTONE_ID)
            length, tombstone = await _execute(pipe)
            if tombstone:
                self._peer_closed = True
                raise LinkClosed("the other side closed the link")
            self._outbox_len = int(length)
            if self._outbox_len < self._maxlen:
                return
            await asyncio.sleep(FULL_POLL_S)

    async def recv(self) -> Any:
        """The next message; raises LinkClosed after the other side's close entry.

        Cancellation-safe: the read position moves only after a reply has been parsed, and
        a cancelled XREAD costs redis-py its connection (it disconnects rather than leave a
        reply unread), so an entry that arrived during a cancelled recv is read again by
        the next one. Deletions that a cancellation interrupted are retried with the next
        read, so no consumed entry stays behind to hold the writer back.
        """
        async with self._recv_lock:
            return await self._next()

    async def _next(self) -> Any:
        while True:
            self._check_open()
            pipe = self._redis.pipeline(transaction=False)
            deleting = list(self._undeleted)
            if deleting:
                pipe.xdel(self._inbox, *deleting)
            pipe.xread({self._inbox: self._last_id}, count=1, block=self._block_ms)
            results = await _execute(pipe)
            del self._undeleted[: len(deleting)]
            entries = _stream_entries(results[-1])
            if not entries:
                continue  # the block timed out: look at our own state and wait again
            entry_id, fields = entries[0]
            self._last_id = entry_id
            self._undeleted.append(entry_id)
            header = fields.get(b"h")
            if header is None:
                # A close entry (`c`), or our own tombstone if close() ran on this end
                # while this recv was blocked.
                if b"c" in fields:
                    self._peer_closed = True
                raise LinkClosed("the link is closed")
            return decode(header, [fields[f"b{i}".encode()] for i in range(len(fields) - 1)])

    async def close(self) -> None:
        """Idempotent. Tells the other side, or deletes both keys if it has gone already.

        A send that is mid-XADD on this end finishes first, so that it cannot recreate a
        key after the last close has deleted it. Redis errors and timeouts are logged and
        swallowed; the keys then expire after `ttl_s`.
        """
        if self._closed:
            return
        self._closed = True  # a waiting send gives up within FULL_POLL_S, a recv in block_ms
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S), self._send_lock:
                last = await self._close_script(
                    keys=[self._outbox, self._inbox], args=[self._ttl_s]
                )
            log.debug("link %s closed (%s)", self._outbox, "last" if last else "first")
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning(
                "closing link %s: %s; its keys expire in %d s", self._outbox, exc, self._ttl_s
            )
