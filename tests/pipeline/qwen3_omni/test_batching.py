"""Continuous batching: requests of different lengths share one decode step, and each gets
exactly what it would have got alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from transformers import Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.config import TOKENS
from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.talker_runner import TalkerPrompt, TalkerRunner, TalkerState
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner, ThinkerState
from pipeline.types import Chunk, CodecCodes, HiddenStates, PipelineRequest, StageInput, TextDelta

from .conftest import turn_audio

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]


def text_prompt(instructions: str) -> ThinkerPrompt:
    vocab = ByteVocab()
    ids = chat_prompt(vocab, instructions=instructions, history=[], audio_tokens=0, text="hi")
    return ThinkerPrompt(ids)


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
    tts = thinker.special_embeddings([TOKENS["tts_bos"], TOKENS["tts_eos"], TOKENS["tts_pad"]])

    def opened(prompt: ThinkerPrompt) -> TalkerState:
        state, hidden = thinker.prefill(prompt)
        talking = talker.open(TalkerPrompt(hidden.token_ids, hidden.states, tts))
        for _ in range(4):
            talker.add_reply(talking, thinker.step(state).states)
        talker.end_text(talking)
        talker.prefill(talking)
        return talking

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
