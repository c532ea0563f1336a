"""Playback deadlines: under load, the session nearest to running out of audio goes first.

The engines here take one step at a time (`max_batch=1`), and their clock stands still, so
a session's deadline is just how much audio it has ahead of its listener: a session that has
already made a second of speech waits while one that is just starting catches up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import numpy as np
import pytest

from pipeline.engines.qwen3_omni.code2wav import Code2WavEngine
from pipeline.engines.qwen3_omni.playback import Playback
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.types import (
    AudioChunk,
    Chunk,
    CodecCodes,
    HiddenStates,
    PipelineRequest,
    StageInput,
)

from .conftest import turn_audio


def test_a_playback_is_due_a_budget_after_arrival_then_when_its_audio_runs_out() -> None:
    now = [100.0]
    playback = Playback(lambda: now[0], budget_s=0.3)
    assert playback.deadline() == pytest.approx(100.3)  # no audio yet: the first is due
    now[0] = 101.0
    playback.produced(0.16)  # the first audio: the listener starts playing now
    assert playback.deadline() == pytest.approx(101.16)
    now[0] = 101.1
    playback.produced(2.0)  # made faster than it plays: due seconds from now
    assert playback.deadline() == pytest.approx(103.16)
    assert playback.produced_s == pytest.approx(2.16)
    with pytest.raises(ValueError, match="budget_s"):
        Playback(budget_s=-1)


def stopped() -> float:
    """A clock at which no time passes."""
    return 0.0


async def feed(chunks: Sequence[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def race(
    ahead: AsyncGenerator[Chunk, None],
    behind: AsyncGenerator[Chunk, None],
    kind: type[Chunk],
) -> list[str]:
    """Who got each chunk of `kind`, in order, once `behind` has begun: `ahead` (paused so
    far) goes on from `behind`'s first chunk, so from then on both ask for steps."""
    order: list[str] = []
    began = asyncio.Event()

    async def listen(name: str, stream: AsyncGenerator[Chunk, None]) -> None:
        if name == "ahead":
            await began.wait()
        async for chunk in stream:
            if isinstance(chunk, kind):
                order.append(name)
                began.set()

    async with asyncio.timeout(60):
        await asyncio.gather(listen("behind", behind), listen("ahead", ahead))
    return order


def goes_first(order: list[str], steps: int) -> bool:
    """`behind` got `steps` chunks before `ahead` got two (one may slip in while the two
    steps first meet; first come, first served would alternate them)."""
    behind = [i for i, name in enumerate(order) if name == "behind"]
    ahead = [i for i, name in enumerate(order) if name == "ahead"]
    return len(behind) >= steps and (len(ahead) < 2 or behind[steps - 1] < ahead[1])


async def test_code2wav_renders_first_for_the_session_behind_its_playback() -> None:
    engine = Code2WavEngine(
        tiny=True, first_chunk=2, chunk=4, left_context=2, max_batch=1, normalize_peak=0.5,
        clock=stopped,
    )  # fmt: skip
    await engine.start()
    try:
        rng = np.random.default_rng(7)

        def frames(n: int) -> list[CodecCodes]:
            return [
                CodecCodes(codes=rng.integers(0, 2048, (1, 16), dtype=np.int32)) for _ in range(n)
            ]

        def stream(rid: str, n: int) -> AsyncGenerator[Chunk, None]:
            request = PipelineRequest(request_id=rid, audio=turn_audio(0.1))
            return engine.generate(rid, StageInput(request, feed(frames(n))))

        ahead = stream("ahead", 2 + 4 * 7)  # a first chunk of 2 frames, then chunks of 4
        made = 0.0
        for _ in range(5):  # 1.3 s of speech while no time passes
            chunk = await anext(ahead)
            assert isinstance(chunk, AudioChunk)
            made += len(chunk.pcm) / chunk.sample_rate
        assert made > 1.0
        order = await race(ahead, stream("behind", 2 + 4 * 5), AudioChunk)
        assert order.count("behind") == 6 and order.count("ahead") == 3
        assert goes_first(order, 4), order
        assert engine.active_requests() == 0
    finally:
        await engine.close()


async def test_the_talker_makes_frames_first_for_the_session_behind_its_playback() -> None:
    thinker = ThinkerEngine(tiny=True, max_new_tokens=20, min_new_tokens=20)
    talker = TalkerEngine(tiny=True, max_frames=16, min_frames=16, max_batch=1, clock=stopped)
    await thinker.start()
    await talker.start()
    try:

        async def stream(rid: str, seed: int) -> AsyncGenerator[Chunk, None]:
            request = PipelineRequest(request_id=rid, audio=turn_audio(1.0, seed=seed))
            hidden = [
                c async for c in thinker.generate(rid, request) if isinstance(c, HiddenStates)
            ]
            return talker.generate(rid, StageInput(request, feed(hidden)))

        ahead, behind = await stream("ahead", 1), await stream("behind", 2)
        for _ in range(8):  # 0.64 s of speech while no time passes
            assert isinstance(await anext(ahead), CodecCodes)
        order = await race(ahead, behind, CodecCodes)
        assert order.count("behind") == 16 and order.count("ahead") == 8
        assert goes_first(order, 5), order
        assert talker.active_requests() == 0
    finally:
        await talker.close()
        await thinker.close()
