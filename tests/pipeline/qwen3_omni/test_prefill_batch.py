"""Prefills batched across sessions and run in chunks: each session gets what it gets alone."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from transformers import Qwen3OmniMoeConfig

from loadtest import turn_phases
from pipeline.engines.qwen3_omni.audio_features import AudioFeatures
from pipeline.engines.qwen3_omni.model_thread import ModelThread
from pipeline.engines.qwen3_omni.prefill_batch import BatchedPrefill
from pipeline.engines.qwen3_omni.prefill_queue import PrefillQueue
from pipeline.engines.qwen3_omni.prefix_cache import PrefixCache
from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.thinker_runner import (
    ThinkerHidden,
    ThinkerPast,
    ThinkerPrompt,
    ThinkerRunner,
    ThinkerState,
)
from pipeline.engines.qwen3_omni.vision_input import FrameImages
from pipeline.types import PipelineRequest, TextDelta

from .conftest import camera_frame, turn_audio

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]


def prompt(
    text: str | None, *, audio_s: float = 0.0, frames: int = 0, seed: int = 0
) -> ThinkerPrompt:
    """A turn of typed text, speech or both, with camera frames: every prompt a different
    length, so that a batch has padding in every place it can."""
    audio = AudioFeatures()(turn_audio(audio_s, seed)) if audio_s else None
    vision = FrameImages()([camera_frame(40 * i, seed + i) for i in range(frames)])
    ids = chat_prompt(
        ByteVocab(),
        instructions=f"Be brief, session {seed}.",
        history=[],
        audio_tokens=audio.tokens if audio else 0,
        text=text,
        image_tokens=vision.tokens if vision else (),
    )
    return ThinkerPrompt(ids, audio, vision)


def mixed_prompts() -> list[ThinkerPrompt]:
    return [
        prompt(None, audio_s=1.5, frames=2, seed=1),
        prompt("what is this?", seed=2),
        prompt(None, audio_s=0.6, seed=3),
        prompt("and this one, please look", frames=1, seed=4),
    ]


def decode(runner: ThinkerRunner, state: ThinkerState, steps: int) -> list[int]:
    for _ in range(steps):
        runner.step(state)
    return state.generated


def run_job(
    runner: ThinkerRunner,
    prompts: list[tuple[ThinkerPrompt, ThinkerPast | None]],
    chunk_tokens: int,
) -> tuple[list[tuple[ThinkerState, ThinkerHidden]], int]:
    job = runner.prefill_job(prompts, chunk_tokens=chunk_tokens)
    job.batch.begin()
    while not job.batch.done:
        job.batch.run_chunk()
    return runner.finish_prefill(job), job.batch.chunks_run


@pytest.mark.parametrize("chunk_tokens", [0, 64, 30])
def test_batched_and_chunked_prefill_gives_each_prompt_its_own_tokens(
    tiny_parts: Parts, chunk_tokens: int
) -> None:
    model, config = tiny_parts["thinker"]
    prompts = mixed_prompts()
    alone = ThinkerRunner(model, config)
    expected = []
    for one in prompts:
        state, hidden = alone.prefill(one)
        expected.append((hidden.states, decode(alone, state, 6)))

    together = ThinkerRunner(model, config)
    done, chunks = run_job(together, [(one, None) for one in prompts], chunk_tokens)
    if chunk_tokens:
        assert chunks > 1  # the chunks really were several
    for (state, hidden), (states, tokens) in zip(done, expected, strict=True):
        assert hidden.states.shape == states.shape
        np.testing.assert_allclose(hidden.states, states, atol=1e-4)
        assert decode(together, state, 6) == tokens


def test_batched_prefill_goes_on_from_each_session_s_past(tiny_parts: Parts) -> None:
    """Rows with different pasts (a cached prefix, a session's earlier turn, none) batch."""
    model, config = tiny_parts["thinker"]
    first, second = prompt("first turn", seed=5), prompt(None, audio_s=0.8, seed=6)
    runner = ThinkerRunner(model, config)
    pasts = []
    for one in (first, second):
        state, hidden = runner.prefill(one)
        pasts.append(ThinkerPast(state.cache, state.length, state.rope_delta, hidden.states))
    follow_ups = [
        ThinkerPrompt(first.input_ids + prompt("more", seed=7).input_ids[3:]),
        ThinkerPrompt(second.input_ids + prompt("go on, tell me", seed=8).input_ids[3:]),
    ]

    def fresh_past(index: int) -> ThinkerPast:
        state, hidden = ThinkerRunner(model, config).prefill((first, second)[index])
        return ThinkerPast(state.cache, state.length, state.rope_delta, hidden.states)

    expected: list[tuple[npt.NDArray[np.float32] | None, list[int]]] = []
    for index, follow_up in enumerate(follow_ups):
        state, hidden = runner.prefill(follow_up, past=fresh_past(index))
        expected.append((hidden.states, decode(runner, state, 5)))
    expected.append((None, decode(runner, runner.prefill(first)[0], 5)))

    cached = ThinkerRunner(model, config, prefix_cache=PrefixCache(4096))
    cached.prefill(first)  # its text is now a cached prefix: the batch's third row reuses it
    jobs = [(follow_ups[0], fresh_past(0)), (follow_ups[1], fresh_past(1)), (first, None)]
    done, _ = run_job(cached, jobs, chunk_tokens=16)
    assert cached.last_prefill_tokens < sum(len(p.input_ids) for p, _ in jobs)
    for (state, hidden), (states, tokens) in zip(done, expected, strict=True):
        if states is not None:
            np.testing.assert_allclose(hidden.states, states, atol=1e-4)
        assert decode(cached, state, 5) == tokens


def test_a_row_with_no_past_batches_beside_one_with_a_past(tiny_parts: Parts) -> None:
    """No prefix cache: a fresh prompt (no past at all) and a session's follow-up in one
    batch, each as alone (the fresh row's past is all padding)."""
    model, config = tiny_parts["thinker"]
    runner = ThinkerRunner(model, config)
    first = prompt("first turn", seed=5)

    def past() -> ThinkerPast:
        state, hidden = ThinkerRunner(model, config).prefill(first)
        return ThinkerPast(state.cache, state.length, state.rope_delta, hidden.states)

    follow_up = ThinkerPrompt(first.input_ids + prompt("more", seed=7).input_ids[3:])
    fresh = prompt("hello there", seed=9)
    alone = [runner.prefill(follow_up, past=past()), runner.prefill(fresh)]
    done, _ = run_job(runner, [(follow_up, past()), (fresh, None)], chunk_tokens=0)
    for (state, hidden), (want_state, want) in zip(done, alone, strict=True):
        np.testing.assert_allclose(hidden.states, want.states, atol=1e-4)
        assert decode(runner, state, 5) == decode(runner, want_state, 5)


# --- in the engine: gathered, chunked between decode steps, warmed before ready -----------


def spoken(rid: str, seconds: float, seed: int, frames: int = 0) -> PipelineRequest:
    return PipelineRequest(
        request_id=rid,
        audio=turn_audio(seconds, seed=seed),
        frames=tuple(camera_frame(40 * i, seed + i) for i in range(frames)),
    )


async def timed_text(engine: ThinkerEngine, request: PipelineRequest) -> list[tuple[float, str]]:
    """Each reply token's text, with when it came (loop time)."""
    loop = asyncio.get_running_loop()
    return [
        (loop.time(), chunk.text)
        async for chunk in engine.generate(request.request_id, request)
        if isinstance(chunk, TextDelta)
    ]


async def test_sessions_that_speak_at_once_are_prefilled_together_and_answer_as_alone() -> None:
    engine = ThinkerEngine(
        tiny=True, threads=1, max_new_tokens=8, min_new_tokens=8, prefill_batch=4
    )
    await engine.start()
    try:
        turns = [spoken("a", 1.2, 1, frames=1), spoken("b", 0.5, 2), spoken("c", 2.0, 3)]
        alone = [[t for _, t in await timed_text(engine, turn)] for turn in turns]
        prefills = engine.prefills
        assert prefills is not None and prefills.largest_batch == 1
        async with asyncio.timeout(60):
            together = await asyncio.gather(*(timed_text(engine, turn) for turn in turns))
        assert prefills.largest_batch >= 2  # prompts built at once: one batch (or two)
        assert [[t for _, t in answer] for answer in together] == alone
        assert engine.active_requests() == 0
    finally:
        await engine.close()


async def test_a_long_prompt_s_prefill_lets_an_answering_session_go_on() -> None:
    """With chunked prefill, a session already answering gets reply tokens while another
    session's long prompt (seconds of speech and camera frames) is prefilled."""
    engine = ThinkerEngine(
        tiny=True, threads=1, max_new_tokens=150, min_new_tokens=150, prefill_chunk_tokens=24
    )
    await engine.start()
    try:
        async with asyncio.timeout(120):
            talking = asyncio.create_task(timed_text(engine, spoken("talking", 0.5, 4)))
            while engine.active_requests() == 0 or engine.batcher is None:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # well into its answer
            loop = asyncio.get_running_loop()
            asked = loop.time()
            late = await timed_text(engine, spoken("late", 3.0, 5, frames=2))
            first_of_late = late[0][0]
            answer = await talking
        during = [at for at, _ in answer if asked < at < first_of_late]
        assert engine.prefills is not None and engine.prefills.batches >= 2
        assert len(during) >= 3, "the answering session stood still for the whole prefill"
    finally:
        await engine.close()


async def test_each_turn_says_where_its_time_went_before_its_first_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One line a turn, read back by the serve benchmark (`loadtest.turn_phases`): the
    turn's prompt in chunks of 24 positions, every phase counted, the phases adding up to
    the turn's time to its first token; two turns at once are one batch, each with its own
    positions."""
    engine = ThinkerEngine(
        tiny=True, threads=1, max_new_tokens=4, min_new_tokens=4, prefill_chunk_tokens=24
    )
    await engine.start()
    try:
        with caplog.at_level(logging.INFO, logger="parley.pipeline.turn_phases"):
            async with asyncio.timeout(60):
                await timed_text(engine, spoken("alone", 1.5, 6))
                await asyncio.gather(
                    timed_text(engine, spoken("one", 0.5, 7)),
                    timed_text(engine, spoken("two", 2.0, 8)),
                )
        found = turn_phases.turns("\n".join(r.getMessage() for r in caplog.records))
        alone, *pair = found["thinker"]
        assert len(pair) == 2
        assert alone["batch"] == 1 and alone["new"] == alone["positions"] > 24
        assert alone["chunk_count"] == -(-alone["new"] // 24)
        assert alone["staged"] == 0
        parts = sum(alone[k] for k in ("row", "prompt", "queued", "towers", "chunks"))
        assert parts + alone["first_token"] <= alone["in_all"] + 1.0
        assert alone["towers"] > 0 and alone["chunks"] > 0
        summed = turn_phases.summary(found)["thinker"]
        assert summed["turns"] == 3 and summed["in_all"]["n"] == 3
        if all(p["batch"] == 2 for p in pair):  # gathered (they may miss each other)
            news = sorted(p["new"] for p in pair)
            assert news[0] < news[1] and sum(news) == pair[0]["positions"]
    finally:
        await engine.close()


async def assert_cold_on_a_cpu(engine: ThinkerEngine | TalkerEngine) -> None:
    """Unless asked, a stage warms up on a GPU only (a CPU has little to warm)."""
    await engine.start()
    try:
        assert engine.warmed_rows == []
    finally:
        await engine.close()


async def test_the_thinker_is_warm_before_it_is_ready_and_keeps_nothing_of_it() -> None:
    engine = ThinkerEngine(tiny=True, prefill_batch=3, prefix_cache_tokens=4096, warm_up=True)
    await engine.start()
    try:
        assert engine.warmed_rows == [1, 3]  # a batch of one and a full batch, media in
        runner = engine.runner
        assert runner is not None and runner.prefix_cache is not None
        assert len(runner.prefix_cache) == 0  # no made-up prompt lingers
        assert engine.active_requests() == 0
    finally:
        await engine.close()
    await assert_cold_on_a_cpu(ThinkerEngine(tiny=True))


async def test_the_talker_is_warm_before_it_is_ready_and_holds_no_row_after() -> None:
    engine = TalkerEngine(tiny=True, threads=1, decode_rows=4, max_batch=4, warm_up=True)
    await engine.start()
    try:
        assert engine.warmed_rows == [1, 4]  # a prefill alone and a full batch, then a frame
        runner = engine.runner
        assert runner is not None and runner.decoder is not None
        assert runner.decoder.cache.in_use == 0  # the made-up turns' rows were given back
        assert engine.active_requests() == 0
    finally:
        await engine.close()
    await assert_cold_on_a_cpu(TalkerEngine(tiny=True))


async def test_a_prompt_the_model_cannot_take_fails_alone(tiny_parts: Parts) -> None:
    """A batch with a bad prompt (its image placeholders do not match its frames) fails, and
    is run again prompt by prompt: the good prompts are prefilled, only the bad one fails."""
    model, config = tiny_parts["thinker"]
    runner = ThinkerRunner(model, config)
    thread = ModelThread("test-prefill")
    thread.start()
    queue = PrefillQueue("test", thread, runner, max_batch=4, gather_s=1.0)
    queue.start()
    good = prompt("what is this?", frames=1, seed=9)
    bad = ThinkerPrompt(good.input_ids[:-40] + good.input_ids[-3:], good.audio, good.vision)
    try:
        async with asyncio.timeout(60):
            results = await asyncio.gather(
                queue.prefill(lambda: good, None),
                queue.prefill(lambda: bad, None),
                return_exceptions=True,
            )
        assert not isinstance(results[0], BaseException)
        assert isinstance(results[1], Exception)
        _, state, hidden, _ = results[0]
        alone, alone_hidden = runner.prefill(good)
        np.testing.assert_allclose(hidden.states, alone_hidden.states, atol=1e-4)
        assert state.next_token == alone.next_token
        assert queue.largest_batch == 2  # they did go as one batch first
    finally:
        await queue.close()
        await queue.close()  # idempotent
        await thread.close()


async def test_a_prefill_out_of_device_memory_is_run_again_in_smaller_chunks(
    tiny_parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone long prompt whose whole-prompt chunk runs out of memory (faked: a chunk past
    260 positions raises CUDA's OutOfMemoryError) is prefilled again in a quarter-size
    chunk (at least 256 positions) and answers as a prefill that never failed."""
    model, config = tiny_parts["thinker"]
    runner = ThinkerRunner(model, config)
    long = prompt("tell me about it " * 36, seed=11)  # ~640 positions
    alone, alone_hidden = runner.prefill(long)
    assert len(long.input_ids) > 600
    tried: list[int] = []
    run_chunk = BatchedPrefill.run_chunk

    def short_of_memory(batch: BatchedPrefill) -> None:
        tried.append(batch.chunk_columns)
        if batch.chunk_columns > 260:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 192.00 MiB")
        run_chunk(batch)

    monkeypatch.setattr(BatchedPrefill, "run_chunk", short_of_memory)
    thread = ModelThread("test-prefill-oom")
    thread.start()
    queue = PrefillQueue("test", thread, runner, max_batch=4)
    queue.start()
    try:
        async with asyncio.timeout(60):
            _, state, hidden, _ = await queue.prefill(lambda: long, None)
        assert tried[0] == len(long.input_ids) and 256 in tried  # whole, then a quarter
        np.testing.assert_allclose(hidden.states, alone_hidden.states, atol=1e-4)
        assert state.next_token == alone.next_token
    finally:
        await queue.close()
        await thread.close()
