"""The shared-memory link: one copy in, views out, ring space freed when arrays die."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import AsyncIterator

import numpy as np
import pytest

from pipeline.connectors.base import LinkClosed
from pipeline.connectors.shm import ShmLink


@pytest.fixture
async def pair() -> AsyncIterator[tuple[ShmLink, ShmLink]]:
    a_sock, b_sock = socket.socketpair()
    out, back, spec = ShmLink.create_rings(capacity=1 << 20)
    a = await ShmLink.open(a_sock, out, back)
    b = await ShmLink.attach(b_sock, spec)
    yield a, b
    gc.collect()
    await b.close()
    await a.close()


async def test_arrays_and_objects_round_trip_both_ways(pair: tuple[ShmLink, ShmLink]) -> None:
    a, b = pair
    hidden = np.random.default_rng(1).random((64, 896), dtype=np.float32)
    codes = np.arange(600, dtype=np.int32)
    await a.send(("chunk", "resp_1", {"hidden": hidden, "codes": codes, "jpeg": b"\xff\xd8"}))
    kind, rid, body = await b.recv()
    assert (kind, rid, body["jpeg"]) == ("chunk", "resp_1", b"\xff\xd8")
    assert np.array_equal(body["hidden"], hidden) and body["hidden"].dtype == np.float32
    assert np.array_equal(body["codes"], codes)
    # The received array is a view on the shared ring, not a copy.
    assert not body["hidden"].flags.owndata
    await b.send({"back": np.ones(3)})
    assert np.array_equal((await a.recv())["back"], np.ones(3))


async def test_ring_space_returns_when_arrays_are_dropped(pair: tuple[ShmLink, ShmLink]) -> None:
    a, b = pair
    block = np.zeros(300_000, dtype=np.uint8)  # three fit in the 1 MiB ring, four do not
    held = [await _through(a, b, block) for _ in range(3)]
    blocked = asyncio.create_task(a.send(block))
    await asyncio.sleep(0.05)
    assert not blocked.done()  # backpressure: the reader still holds the space
    del held
    gc.collect()
    await asyncio.wait_for(blocked, 2)
    assert (await b.recv()).nbytes == 300_000


async def test_messages_larger_than_the_ring_still_arrive(pair: tuple[ShmLink, ShmLink]) -> None:
    a, b = pair
    big = np.arange(400_000, dtype=np.int32)  # 1.6 MB > ring
    received = await _through(a, b, big)
    assert np.array_equal(received, big)


async def test_closing_one_end_ends_the_other(pair: tuple[ShmLink, ShmLink]) -> None:
    a, b = pair
    await a.close()
    with pytest.raises(LinkClosed):
        await b.recv()
    with pytest.raises(LinkClosed):
        await a.send("after close")


async def _through(a: ShmLink, b: ShmLink, array: np.ndarray) -> np.ndarray:
    _, received = await asyncio.gather(a.send(array), b.recv())
    assert isinstance(received, np.ndarray)
    return received
