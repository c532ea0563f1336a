"""The stage link's messages: every one crosses both links whole, arrays out of band."""

from __future__ import annotations

import gc
import socket
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from pipeline.connectors.base import decode, encode
from pipeline.connectors.redis_streams import RedisStreamLink
from pipeline.connectors.shm import ShmLink
from pipeline.gpu_usage import GpuUsage
from pipeline.link_messages import (
    Abort,
    Alive,
    ChunkMessage,
    Close,
    Done,
    Fatal,
    ForgetSession,
    Generate,
    Input,
    InputEnd,
    Ready,
    Stats,
    StatsReply,
    Stuck,
)
from pipeline.types import CodecCodes, End, HiddenStates, PipelineRequest, TextDelta

HIDDEN = np.random.default_rng(3).standard_normal((64, 1024), dtype=np.float32)  # 256 KiB
AUDIO = np.arange(16_000, dtype=np.int16)


def messages() -> list[Any]:
    request = PipelineRequest(request_id="resp_1", audio=AUDIO, text="hi")
    return [
        Generate("resp_1", request, streamed=True),
        Input("resp_1", HiddenStates(HIDDEN, {"layer": 24})),
        InputEnd("resp_1"),
        Abort("resp_1"),
        ForgetSession("sess_1"),
        Stats(7),
        Close(),
        Ready(),
        Alive(),
        Alive(gpu=GpuUsage(3 << 30, 2 << 30, 80 << 30, 75 << 30, 4 << 30)),
        Stuck("the model thread has made no progress for 6.0 s (bound 5 s)"),
        Fatal("RuntimeError: no GPU"),
        ChunkMessage("resp_1", CodecCodes(np.arange(16, dtype=np.int32))),
        ChunkMessage("resp_1", TextDelta("Hello")),
        ChunkMessage("resp_1", End()),
        Done("resp_1"),
        StatsReply(7, 2),
    ]


def assert_same(got: Any, want: Any) -> None:
    """Equal field by field, arrays by value (dataclass == cannot compare arrays)."""
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    elif hasattr(want, "__dataclass_fields__"):
        for name in want.__dataclass_fields__:
            assert_same(getattr(got, name), getattr(want, name))
    else:
        assert got == want


def test_arrays_inside_a_message_stay_out_of_the_pickle() -> None:
    header, buffers = encode(Input("resp_1", HiddenStates(HIDDEN)))
    assert len(header) < 1_000
    assert [b.nbytes for b in buffers] == [HIDDEN.nbytes]
    got = decode(header, buffers)
    assert isinstance(got, Input) and isinstance(got.chunk, HiddenStates)
    assert np.shares_memory(got.chunk.array, np.frombuffer(buffers[0], dtype=np.uint8))


async def test_every_message_crosses_the_shared_memory_link() -> None:
    a_sock, b_sock = socket.socketpair()
    out, back, spec = ShmLink.create_rings(capacity=1 << 20)
    a = await ShmLink.open(a_sock, out, back)
    b = await ShmLink.attach(b_sock, spec)
    try:
        for message in messages():
            await a.send(message)
            got = await b.recv()
            assert_same(got, message)
            if isinstance(got, Input):
                assert isinstance(got.chunk, HiddenStates)
                assert not got.chunk.array.flags.owndata  # a view onto the ring
            del got
    finally:
        gc.collect()
        await b.close()
        await a.close()


async def test_every_message_crosses_the_redis_streams_link(redis: aioredis.Redis) -> None:
    a, b = RedisStreamLink.pair(redis, "test-link-messages", block_ms=200)
    try:
        for message in messages():
            await b.send(message)
            assert_same(await a.recv(), message)
    finally:
        await a.close()
        await b.close()
