"""The Redis-streams link against a real Redis: transfer, backpressure, close, cancellation."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from pipeline.connectors.base import LinkClosed
from pipeline.connectors.redis_streams import RedisStreamLink, link_keys

Pair = tuple[RedisStreamLink, RedisStreamLink]

_names = itertools.count()


@pytest.fixture
async def link(redis: aioredis.Redis) -> AsyncIterator[Pair]:
    """Two ends of a fresh link, both closed afterwards (so no key is left)."""
    a, b = RedisStreamLink.pair(redis, f"test{next(_names)}", block_ms=200)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def messages() -> list[Any]:
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((200, 3584), dtype=np.float32)
    tokens = np.arange(600, dtype=np.int32)
    return [
        hidden,
        tokens,
        "a string",
        b"\x00raw bytes\xff",
        {"rid": "resp_1", "chunk": {"hidden": hidden, "ids": (tokens, [1, 2.5, None])}},
        ("chunk", "resp_1", (hidden[:2], {"empty": np.zeros(0, dtype=np.float32)})),
        np.asfortranarray(tokens.reshape(20, 30)),  # not C-contiguous: travels another way
    ]


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, tuple | list):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got == want


async def test_round_trip_both_directions_in_order(link: Pair) -> None:
    a, b = link
    sent = messages()
    for message in sent:
        await a.send(message)
        await b.send(message)
    for message in sent:
        assert_same(await b.recv(), message)
        assert_same(await a.recv(), message)


async def test_arrays_travel_as_raw_field_values(redis: aioredis.Redis) -> None:
    a, b = RedisStreamLink.pair(redis, "raw")
    try:
        hidden = np.ones((200, 3584), dtype=np.float32)
        await a.send({"hidden": hidden, "ids": np.arange(600, dtype=np.int32)})
        [(_, fields)] = await redis.xrange(link_keys("raw")[0])
        assert set(fields) == {b"h", b"b0", b"b1"}
        assert fields[b"b0"] == hidden.tobytes()  # the array's bytes as they are
        assert len(fields[b"b1"]) == 600 * 4
        assert len(fields[b"h"]) < 512  # the header holds no array data
        got = await b.recv()
        np.testing.assert_array_equal(got["hidden"], hidden)
    finally:
        await a.close()
        await b.close()


async def test_messages_sent_before_the_reader_starts_are_kept(redis: aioredis.Redis) -> None:
    writer = RedisStreamLink.end(redis, "early", "a")
    try:
        await writer.send("first")
        await writer.send("second")
        reader = RedisStreamLink.end(redis, "early", "b")
        try:
            assert await reader.recv() == "first"
            assert await reader.recv() == "second"
        finally:
            await reader.close()
    finally:
        await writer.close()


async def test_full_link_blocks_the_sender_until_the_reader_consumes(
    redis: aioredis.Redis,
) -> None:
    a, b = RedisStreamLink.pair(redis, "bp", maxlen=4, block_ms=200)
    a2b, _ = link_keys("bp")
    try:
        for i in range(4):
            await asyncio.wait_for(a.send(i), timeout=1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(a.send(99), timeout=0.2)
        assert await redis.xlen(a2b) == 4  # the cancelled send added nothing

        sent = 4

        async def sender() -> None:
            nonlocal sent
            for i in range(4, 20):
                await a.send(i)
                sent += 1

        task = asyncio.create_task(sender())
        try:
            await asyncio.sleep(0.1)
            assert sent == 4  # still blocked: nobody has read
            got = []
            for _ in range(20):
                got.append(await asyncio.wait_for(b.recv(), timeout=2))
                assert await redis.xlen(a2b) <= 4
            assert got == list(range(20))
            await asyncio.wait_for(task, timeout=2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await a.close()
        await b.close()


async def test_close_ends_the_other_side_after_its_data(redis: aioredis.Redis, link: Pair) -> None:
    a, b = link
    await a.send("last words")
    await a.close()
    await a.close()  # idempotent
    with pytest.raises(LinkClosed):
        await a.send("x")
    with pytest.raises(LinkClosed):
        await a.recv()
    assert await b.recv() == "last words"
    with pytest.raises(LinkClosed):
        await b.recv()
    with pytest.raises(LinkClosed):
        await b.recv()
    with pytest.raises(LinkClosed):
        await b.send("anyone there?")
    await b.close()
    assert await redis.keys("parley:link:*") == []


async def test_sender_learns_that_the_reader_closed(redis: aioredis.Redis, link: Pair) -> None:
    a, b = link
    await a.send("unread")
    await b.close()
    with pytest.raises(LinkClosed):
        await a.send("to nobody")
    await a.close()
    assert await redis.keys("parley:link:*") == []


async def test_close_releases_a_sender_blocked_on_a_full_link(redis: aioredis.Redis) -> None:
    a, b = RedisStreamLink.pair(redis, "stuck", maxlen=1, block_ms=200)
    try:
        await a.send(np.zeros(1000))
        task = asyncio.create_task(a.send(np.zeros(1000)))
        await asyncio.sleep(0.05)
        assert not task.done()
        await b.close()  # the reader goes away without reading
        with pytest.raises(LinkClosed):
            await asyncio.wait_for(task, timeout=1)
    finally:
        await a.close()
        await b.close()
    assert await redis.keys("parley:link:*") == []


@pytest.mark.parametrize("order", ["a first", "b first", "together"])
async def test_no_keys_remain_once_both_ends_closed(redis: aioredis.Redis, order: str) -> None:
    a, b = RedisStreamLink.pair(redis, f"order-{order}", block_ms=200)
    await a.send(np.ones(10))
    await b.send("unread too")
    assert len(await redis.keys("parley:link:*")) == 2
    if order == "a first":
        await a.close()
        await b.close()
    elif order == "b first":
        await b.close()
        await a.close()
    else:
        await asyncio.gather(a.close(), b.close())
    assert await redis.keys("parley:link:*") == []


async def test_close_wakes_a_recv_blocked_on_the_same_end(redis: aioredis.Redis) -> None:
    a, b = RedisStreamLink.pair(redis, "self", block_ms=100)
    try:
        task = asyncio.create_task(b.recv())
        await asyncio.sleep(0.05)
        await b.close()
        with pytest.raises(LinkClosed):
            await asyncio.wait_for(task, timeout=1)
    finally:
        await a.close()
        await b.close()


async def test_writes_set_a_ttl(redis: aioredis.Redis) -> None:
    a, b = RedisStreamLink.pair(redis, "ttl", ttl_s=77)
    try:
        await a.send("x")
        assert 0 < await redis.ttl(link_keys("ttl")[0]) <= 77
    finally:
        await a.close()
        await b.close()


async def test_cancelled_recv_loses_nothing(link: Pair) -> None:
    a, b = link
    waiting = asyncio.create_task(b.recv())
    await asyncio.sleep(0.05)  # blocked in XREAD by now
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await a.send("next")
    assert await asyncio.wait_for(b.recv(), timeout=1) == "next"


async def test_recv_cancelled_at_any_point_loses_nothing(link: Pair) -> None:
    """Timeouts from tens of microseconds up cut recv short all over (in XREAD, while the
    reply is parsed, around the XDEL), with messages already queued and then arriving one
    by one; every message still comes out exactly once, in order."""
    a, b = link
    payload = np.arange(50_000, dtype=np.float32)
    count = 80

    async def sender() -> None:
        for i in range(count):
            await a.send((i, payload))
            if i >= count // 2:
                await asyncio.sleep(0.001 * (i % 3))

    task = asyncio.create_task(sender())
    got: list[int] = []
    timeouts = itertools.cycle([k * 0.00002 for k in range(1, 25)] + [0.001, 0.003, 0.005])
    try:
        async with asyncio.timeout(20):
            while len(got) < count:
                try:
                    index, data = await asyncio.wait_for(b.recv(), timeout=next(timeouts))
                except TimeoutError:
                    continue
                np.testing.assert_array_equal(data, payload)
                got.append(index)
        await task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert got == list(range(count))


async def test_rejects_a_decoding_client(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ValueError, match="decode_responses"):
            RedisStreamLink.end(client, "x", "a")
    finally:
        await client.aclose()


async def test_close_releases_a_send_waiting_on_the_same_end(redis: aioredis.Redis) -> None:
    a, b = RedisStreamLink.pair(redis, "own", maxlen=1, block_ms=200)
    try:
        await a.send("fills it")
        task = asyncio.create_task(a.send("waits"))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(a.close(), timeout=1)
        with pytest.raises(LinkClosed):
            await asyncio.wait_for(task, timeout=1)
        assert await b.recv() == "fills it"  # sent before the close: still delivered
        with pytest.raises(LinkClosed):
            await b.recv()
    finally:
        await a.close()
        await b.close()


async def test_works_over_resp3(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url, protocol=3)
    a, b = RedisStreamLink.pair(client, "resp3", block_ms=100)
    try:
        hidden = np.arange(12, dtype=np.float32).reshape(3, 4)
        await a.send({"hidden": hidden})
        got = await b.recv()
        np.testing.assert_array_equal(got["hidden"], hidden)
    finally:
        await a.close()
        await b.close()
        await client.aclose()


async def test_concurrent_recvs_each_get_a_different_message(link: Pair) -> None:
    a, b = link
    readers = [asyncio.create_task(b.recv()) for _ in range(5)]
    for i in range(5):
        await a.send(i)
    got = await asyncio.wait_for(asyncio.gather(*readers), timeout=2)
    assert sorted(got) == list(range(5))
