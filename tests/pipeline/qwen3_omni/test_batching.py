"""Continuous batching: requests of different lengths share one decode step, and each gets
exactly what it would have got alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from transformers import Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.code2wav import Code2WavEngine
from pipeline.engines.qwen3_omni.code2wav_runner import Code2WavRunner
from pipeline.engines.qwen3_omni.config import TOKENS as SPECIAL
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.talker_runner import TalkerPrompt, TalkerRunner, TalkerState
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner, ThinkerState
from pipeline.types import (
    AudioChunk,
    Chunk,
    CodecCodes,
    HiddenStates,
    PipelineRequest,
    StageInput,
    TextDelta,
)

from .conftest import open_talker, text_prompt, turn_audio
from .test_runners import spoken_prompt

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]


def test_a_batched_thinker_step_is_each_request_s_own_step(tiny_parts: Parts) -> None:
    runner = ThinkerRunner(*tiny_parts["thinker"])
    short, long = text_prompt("Be brief."), text_prompt("Answer at length, " * 6)
    batched: list[ThinkerState] = [runner.prefill(short)[0], runner.prefill(long)[0]]
    alone: list[ThinkerState] = [runner.prefill(short)[0], runner.prefill(long)[0]]
    for _ in range(5):
        together = runner.step_batch(batched)
        for state, joint in zip(alone, together, strict=True):
            own = runner.step(state)
            assert own.token_ids == joint.token_ids
            np.testing.assert_allclose(own.states, joint.states, atol=1e-5)
    assert [s.generated for s in batched] == [s.generated for s in alone]
    assert batched[0].length != batched[1].length


def test_a_batched_talker_frame_is_each_request_s_own_frame(tiny_parts: Parts) -> None:
    thinker = ThinkerRunner(*tiny_parts["thinker"])
    model, config = tiny_parts["talker"]
    talker = TalkerRunner(model, config)

    def opened(prompt: ThinkerPrompt) -> TalkerState:
        return open_talker(thinker, talker, prompt, reply_tokens=4)

    prompts = [text_prompt("Be brief."), text_prompt("Answer at length, " * 6)]
    batched = [opened(p) for p in prompts]
    alone = [opened(p) for p in prompts]
    for _ in range(6):
        together = talker.predict_batch(batched)
        assert all(codes is not None for codes in together)
        talker.advance_batch(batched, [c for c in together if c is not None])
        for state, joint in zip(alone, together, strict=True):
            own = talker.predict(state)
            assert own is not None and joint is not None
            np.testing.assert_array_equal(own, joint)
            talker.advance(state, own)


@pytest.fixture
async def thinker() -> AsyncIterator[ThinkerEngine]:
    engine = ThinkerEngine(tiny=True, max_new_tokens=20, min_new_tokens=20, max_batch=4)
    await engine.start()
    yield engine
    await engine.close()


def turn(rid: str, seconds: float, seed: int) -> PipelineRequest:
    return PipelineRequest(request_id=rid, audio=turn_audio(seconds, seed=seed))


async def text_of(engine: ThinkerEngine, request: PipelineRequest) -> list[str]:
    out = [c async for c in engine.generate(request.request_id, request)]
    return [c.text for c in out if isinstance(c, TextDelta)]


async def test_two_sessions_share_thinker_steps_and_answer_as_alone(
    thinker: ThinkerEngine,
) -> None:
    first, second = turn("s1", 1.0, seed=1), turn("s2", 2.0, seed=2)
    alone = [await text_of(thinker, first), await text_of(thinker, second)]
    assert thinker.batcher is not None and thinker.batcher.largest_batch == 1
    async with asyncio.timeout(30):
        together = await asyncio.gather(text_of(thinker, first), text_of(thinker, second))
    assert thinker.batcher.largest_batch == 2
    assert list(together) == alone
    assert thinker.active_requests() == 0


async def test_two_sessions_share_talker_frames_and_speak_as_alone(
    thinker: ThinkerEngine,
) -> None:
    talker = TalkerEngine(tiny=True, max_frames=10, min_frames=10, max_batch=4)
    await talker.start()
    try:
        upstreams = []
        for rid, seconds, seed in (("s3", 1.0, 3), ("s4", 1.5, 4)):
            request = turn(rid, seconds, seed)
            upstreams.append((request, [c async for c in thinker.generate(rid, request)]))

        async def frames(request: PipelineRequest, chunks: list[Chunk]) -> list[list[int]]:
            async def feed() -> AsyncIterator[Chunk]:
                for chunk in chunks:
                    if isinstance(chunk, HiddenStates):
                        yield chunk

            stream = talker.generate(request.request_id, StageInput(request, feed()))
            return [c.codes[0].tolist() async for c in stream if isinstance(c, CodecCodes)]

        alone = [await frames(*u) for u in upstreams]
        async with asyncio.timeout(30):
            together = await asyncio.gather(*(frames(*u) for u in upstreams))
        assert talker.batcher is not None and talker.batcher.largest_batch == 2
        assert list(together) == alone
        assert talker.active_requests() == 0
    finally:
        await talker.close()


async def test_the_talker_prefills_its_prompt_before_the_first_reply_token(
    thinker: ThinkerEngine,
) -> None:
    """The Thinker's prompt states come, its first reply token is slow to: the Talker
    prefills all of its prompt but the last position meanwhile (which needs that token), and
    its first frame step feeds that position. It speaks the frames it speaks when the token
    came with the prompt states (then, as a rule, the whole prompt prefilled at once; both
    ways against transformers: test_reference_equality.py)."""
    talker = TalkerEngine(tiny=True, max_frames=10, min_frames=10)
    await talker.start()
    try:
        request = turn("s5", 1.2, 5)
        states = [c async for c in thinker.generate("s5", request) if isinstance(c, HiddenStates)]
        released = asyncio.Event()

        async def feed(hold: bool) -> AsyncIterator[Chunk]:
            yield states[0]  # the prompt's
            if hold:
                await released.wait()
            for chunk in states[1:]:
                yield chunk

        async def frames(rid: str, hold: bool) -> list[list[int]]:
            stream = talker.generate(rid, StageInput(request, feed(hold)))
            return [c.codes[0].tolist() async for c in stream if isinstance(c, CodecCodes)]

        whole = await frames("whole", hold=False)
        async with asyncio.timeout(30), asyncio.TaskGroup() as group:
            early = group.create_task(frames("early", hold=True))
            while (state := talker._requests.state("early")) is None or state.length == 0:
                await asyncio.sleep(0.01)
            assert state.prompt_end is not None and not state.reply  # all but its last
            prefilled = state.length
            released.set()
            assert await early == whole
        assert state.length > prefilled and state.prompt_end is None
        assert talker.active_requests() == 0
    finally:
        await talker.close()


def test_a_batched_talker_prefill_is_each_request_s_own(tiny_parts: Parts) -> None:
    """Prompts of different lengths (speech, frames, typed text) prefilled as one batch give
    each request the frames it gets prefilled alone."""
    thinker = ThinkerRunner(*tiny_parts["thinker"])
    model, config = tiny_parts["talker"]
    talker = TalkerRunner(model, config)
    tts = thinker.special_embeddings([SPECIAL["tts_bos"], SPECIAL["tts_eos"], SPECIAL["tts_pad"]])
    prompts = [text_prompt("Be brief."), text_prompt("Answer at length, " * 6), spoken_prompt()]

    def opened(prompt: ThinkerPrompt) -> TalkerState:
        thinking, said = thinker.prefill(prompt)
        talking = talker.open(TalkerPrompt(said.token_ids, said.states, tts))
        for _ in range(3):
            talker.add_reply(talking, thinker.step(thinking).states)
        talker.end_text(talking)
        return talking

    together = [opened(p) for p in prompts]
    talker.prefill_batch(together)
    alone = [opened(p) for p in prompts]
    for state in alone:
        talker.prefill(state)
    assert len({state.length for state in together}) == 2  # system items are not its
    for joint, own in zip(together, alone, strict=True):
        assert joint.length == own.length and joint.rope_delta == own.rope_delta
        for _ in range(4):
            ours, theirs = talker.predict(joint), talker.predict(own)
            assert ours is not None and theirs is not None
            np.testing.assert_array_equal(ours, theirs)
            talker.advance(joint, ours)
            talker.advance(own, theirs)


def test_a_batched_code2wav_decode_is_each_window_s_own(tiny_parts: Parts) -> None:
    runner = Code2WavRunner(tiny_parts["code2wav"][0])
    rng = np.random.default_rng(5)
    windows = [
        (rng.integers(0, 2048, (n, 16), dtype=np.int32), ctx) for n, ctx in ((5, 0), (30, 5))
    ]
    together = runner.decode_batch(windows)
    for (frames, context), joint in zip(windows, together, strict=True):
        np.testing.assert_allclose(runner.decode(frames, context), joint, atol=1e-6)


async def test_two_sessions_share_code2wav_chunks_and_sound_as_alone() -> None:
    engine = Code2WavEngine(
        tiny=True, first_chunk=2, chunk=4, left_context=2, max_batch=4, normalize_peak=0.5
    )
    await engine.start()
    try:
        rng = np.random.default_rng(6)
        streams = [
            [CodecCodes(codes=rng.integers(0, 2048, (1, 16), dtype=np.int32)) for _ in range(n)]
            for n in (10, 14)
        ]

        async def pcm(rid: str, frames: list[CodecCodes]) -> np.ndarray[Any, Any]:
            async def feed() -> AsyncIterator[Chunk]:
                for frame in frames:
                    yield frame

            request = PipelineRequest(request_id=rid, audio=turn_audio(0.1))
            out = engine.generate(rid, StageInput(request, feed()))
            return np.concatenate([c.pcm async for c in out if isinstance(c, AudioChunk)])

        alone = [await pcm(f"c{i}", frames) for i, frames in enumerate(streams)]
        async with asyncio.timeout(30):
            together = await asyncio.gather(*(pcm(f"d{i}", f) for i, f in enumerate(streams)))
        assert engine.batcher is not None and engine.batcher.largest_batch == 2
        for joint, own in zip(together, alone, strict=True):
            assert len(joint) == len(own) and np.abs(joint.astype(int) - own).max() <= 1
        assert engine.active_requests() == 0
    finally:
        await engine.close()
