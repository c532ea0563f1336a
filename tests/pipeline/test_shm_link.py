"""The shared-memory link: one copy in, views out, ring space freed when arrays die."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.connectors.base import LinkClosed
from pipeline.connectors.shm import BLOCK_MIN, ShmLink


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


async def test_a_full_ring_never_holds_up_the_sender(pair: tuple[ShmLink, ShmLink]) -> None:
    """A reader that keeps one request's arrays while it waits for another message must get
    that message: the sender does not wait for ring space (that deadlocked four concurrent
    Qwen3-Omni prompts on one link). What does not fit goes through the socket, held arrays
    stay intact, and the ring is used again once they are dropped."""
    a, b = pair
    blocks = [np.full(300_000, k, dtype=np.uint8) for k in range(5)]  # 3 fit in 1 MiB
    held = [await _through(a, b, block) for block in blocks[:3]]
    overflow = await asyncio.wait_for(_through(a, b, blocks[3]), 2)
    assert np.array_equal(overflow, blocks[3])
    assert all(np.array_equal(array, block) for array, block in zip(held, blocks, strict=False))
    del held, overflow
    gc.collect()
    head = a.send_ring.head
    again = await _through(a, b, blocks[4])
    assert a.send_ring.head > head and np.array_equal(again, blocks[4])  # on the ring again


async def test_messages_larger_than_the_ring_still_arrive(pair: tuple[ShmLink, ShmLink]) -> None:
    a, b = pair
    big = np.arange(400_000, dtype=np.int32)  # 1.6 MB > ring
    received = await _through(a, b, big)
    assert np.array_equal(received, big)


async def test_a_buffer_past_the_ring_goes_in_a_block_of_its_own_and_leaves_none(
    pair: tuple[ShmLink, ShmLink],
) -> None:
    """Past BLOCK_MIN, what the ring has no room for goes in a one-off shared-memory block
    (a long conversation's hidden states: through the socket they cost ~3 ms a MiB): it
    arrives equal, and no block is left in /dev/shm, received or not."""
    a, b = pair
    before = _blocks()
    big = np.random.default_rng(2).random((2048, 2, 256), dtype=np.float32)  # 4 MiB > ring
    assert big.nbytes > BLOCK_MIN
    received = await _through(a, b, big)
    assert np.array_equal(received, big) and received.dtype == np.float32
    assert not _blocks() - before  # the receiver unlinked it
    await a.send(big)  # never received: the sender's close unlinks it
    assert len(_blocks() - before) == 1
    await a.close()
    assert not _blocks() - before


def _blocks() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("psm_*")}


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
