"""Decode steps on cache rows (the GPU's captured path, run plainly here): each request gets
exactly what its own plain step gives, whatever joins or leaves the batch."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import torch
from transformers import Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.frame_predictor import FramePredictor
from pipeline.engines.qwen3_omni.fused_moe import expert_weights, install_fused_moe, routed_experts
from pipeline.engines.qwen3_omni.sampling import Sampling, sample_rows
from pipeline.engines.qwen3_omni.slot_decoder import SlotDecoder
from pipeline.engines.qwen3_omni.step_graphs import buckets_up_to
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.talker_runner import TalkerRunner, TalkerState
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner, ThinkerState
from pipeline.engines.qwen3_omni.thinker_slots import ThinkerSlots
from pipeline.engines.qwen3_omni.weights import build_part
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import AudioChunk, PipelineRequest, TextDelta

from .conftest import open_talker, text_prompt, turn_audio

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]


def test_both_expert_paths_compute_what_the_block_computes() -> None:
    model, _ = build_part("thinker", tiny=True)
    block = next(m for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock"))
    weights = expert_weights(block)
    x = torch.randn(5, weights.router.shape[1], generator=torch.Generator().manual_seed(1))
    grouped, _ = routed_experts(x, weights, grouped=True)
    gathered, _ = routed_experts(x, weights, grouped=False)
    torch.testing.assert_close(grouped, gathered, atol=1e-6, rtol=1e-4)


def test_fused_experts_compute_what_the_block_computes() -> None:
    for part in ("thinker", "talker"):
        model, _ = build_part(part, tiny=True)
        blocks = [m for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock")]
        x = torch.randn(
            3, 1, blocks[0].gate.weight.shape[1], generator=torch.Generator().manual_seed(0)
        )

        def out(block: Any, x: torch.Tensor = x) -> torch.Tensor:
            result = block(x)
            return torch.as_tensor(result[0] if isinstance(result, tuple) else result)

        before = [out(block) for block in blocks]
        assert install_fused_moe(model) == len(blocks) > 0
        assert install_fused_moe(model) == 0  # idempotent
        for block, expected in zip(blocks, before, strict=True):
            torch.testing.assert_close(out(block), expected, atol=1e-6, rtol=1e-4)


def test_buckets() -> None:
    assert buckets_up_to(1) == [1]
    assert buckets_up_to(8) == [1, 2, 4, 8]
    assert buckets_up_to(10) == [1, 2, 4, 8, 10]


def test_thinker_rows_step_as_each_request_alone(tiny_parts: Parts) -> None:
    model, config = tiny_parts["thinker"]
    runner = ThinkerRunner(model, config)
    slots = ThinkerSlots(
        model, rows=4, max_length=512, accept_layer=runner.accept_layer, reserve=32, capture=False
    )
    prompts = [text_prompt("Be brief."), text_prompt("Answer at length, " * 6), text_prompt("x")]

    def choose(states: list[ThinkerState], logits: torch.Tensor) -> list[int]:
        return runner._choose_rows(states, logits, 0)

    alone = [runner.prefill(p)[0] for p in prompts]
    rowed = [runner.prefill(p)[0] for p in prompts]
    active = rowed[:2]  # the third joins later, the first leaves early
    for step in range(6):
        if step == 2:
            active.append(rowed[2])
        if step == 4:
            slots.release(active.pop(0), keep=False)
        assert all(slots.seat(state) for state in active)
        hidden = slots.step(active, choose)
        for row, state in enumerate(active):
            own = runner.step(alone[rowed.index(state)])
            np.testing.assert_allclose(own.states[0], hidden[row].numpy(), atol=1e-5)
    assert [s.generated for s in rowed] == [s.generated for s in alone]
    # a kept row's cache is the request's own: its next plain step matches
    kept, reference = rowed[1], alone[1]
    slots.release(kept, keep=True)
    assert kept.cache.get_seq_length() == kept.length == reference.length
    np.testing.assert_allclose(runner.step(kept).states, runner.step(reference).states, atol=1e-5)
    assert slots.decoder.cache.in_use == 1


def test_rows_run_out_and_come_back(tiny_parts: Parts) -> None:
    model, config = tiny_parts["thinker"]
    runner = ThinkerRunner(model, config)
    slots = ThinkerSlots(model, rows=1, max_length=64, accept_layer=runner.accept_layer, reserve=8)
    first, second = runner.prefill(text_prompt("a"))[0], runner.prefill(text_prompt("b"))[0]
    assert slots.seat(first) and not slots.seat(second)
    slots.release(first, keep=False)
    slots.release(first, keep=False)  # idempotent
    assert slots.seat(second)
    too_long = runner.prefill(text_prompt("long " * 20))[0]
    slots.release(second, keep=False)
    assert not slots.seat(too_long)  # it could outgrow the row


def test_sampling_on_the_device_keeps_to_top_k_and_top_p() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0, 1.0]]).repeat(400, 1)
    assert set(sample_rows(logits, Sampling()).tolist()) == {1}
    drawn = sample_rows(logits, Sampling(temperature=1.0, top_k=2, top_p=1.0)).tolist()
    assert set(drawn) == {1, 2}
    assert set(sample_rows(logits, Sampling(temperature=1.0, top_k=3, top_p=0.3)).tolist()) == {1}


def test_a_frame_on_rows_is_the_plain_frame(tiny_parts: Parts) -> None:
    thinker = ThinkerRunner(*tiny_parts["thinker"])
    talker_model, config = tiny_parts["talker"]
    greedy = Sampling()
    talker = TalkerRunner(talker_model, config, predictor_sampling=greedy, codec_sampling=greedy)
    predictor = FramePredictor(talker_model, rows=4, sampling=greedy, capture=False)
    states = [
        open_talker(thinker, talker, p, reply_tokens=1)
        for p in (text_prompt("Be brief."), text_prompt("Answer at length, " * 6))
    ]
    plain = talker.predict_batch(states)
    last = torch.cat([s.last_hidden for s in states if s.last_hidden is not None])
    rows, sums = predictor.predict(last, [s.next_code for s in states])
    for index, (state, codes, row) in enumerate(zip(states, plain, rows.tolist(), strict=True)):
        assert codes is not None
        assert codes.tolist() == [state.next_code, *row]
        # the frame's 16 code embeddings summed, as the plain path sums them to feed them
        state.frame_sum = None
        text = talker._text_for_step(state)
        torch.testing.assert_close(
            sums[index : index + 1] + text, talker._frame_embeds(state, codes)
        )


ROWS_GRAPH = """\
name: qwen3_omni_rows_test
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {tiny: true, threads: 1, max_new_tokens: 10, min_new_tokens: 10,
                  decode_rows: 3, max_context: 2048}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {tiny: true, threads: 1, max_frames: 8, min_frames: 8,
                  decode_rows: 3, max_context: 2048}
  - name: code2wav
    engine: qwen3_omni.code2wav
    engine_args: {tiny: true, first_chunk: 2, chunk: 3, left_context: 3}
edges:
  - {from: thinker, to: talker}
  - {from: talker, to: code2wav}
outputs: [thinker, code2wav]
"""


async def test_the_graph_on_cache_rows_answers_concurrent_and_aborted_turns() -> None:
    config = parse_graph(ROWS_GRAPH)
    engines = build_engines(config)
    graph = StageGraph(config, engines)
    await graph.start()
    thinker, talker = engines["thinker"], engines["talker"]
    assert isinstance(thinker, ThinkerEngine) and isinstance(talker, TalkerEngine)
    assert thinker.runner is not None and thinker.runner.slots is not None
    assert talker.runner is not None and talker.runner.decoder is not None

    async def turn(name: str, seconds: float) -> tuple[list[str], int]:
        request = PipelineRequest(request_id=name, audio=turn_audio(seconds, seed=len(name)))
        text, samples = [], 0
        async for chunk in graph.generate(request):
            if isinstance(chunk, TextDelta):
                text.append(chunk.text)
            elif isinstance(chunk, AudioChunk):
                samples += len(chunk.pcm) // 2
        return text, samples

    async def aborted() -> None:
        request = PipelineRequest(request_id="gone", audio=turn_audio(0.5))
        stream = graph.generate(request)
        async for chunk in stream:
            if isinstance(chunk, AudioChunk):
                break  # the caller hangs up mid-answer
        await stream.aclose()

    try:
        async with asyncio.timeout(120):
            # five at once over three rows: two wait for a row, all are answered
            results = await asyncio.gather(
                turn("a", 0.5), turn("bb", 1.0), turn("ccc", 0.7), turn("dddd", 0.4), aborted()
            )
            alone, _ = await turn("a", 0.5)
        answers = [r for r in results if r is not None]
        for text, samples in answers:
            assert len(text) == 10 and samples > 0
        assert answers[0][0] == alone  # greedy: the same words in a batch as alone
        await asyncio.sleep(0.2)  # queued row returns run on the model threads
        assert thinker.runner.slots.decoder.cache.in_use == 0
        assert talker.runner.decoder.cache.in_use == 0
        assert thinker.runner.plain_steps == talker.runner.plain_steps == 0  # none went plainly
        assert thinker.rows is not None and thinker.rows.in_use == 0
        assert talker.rows is not None and talker.rows.in_use == 0
    finally:
        await graph.close()


def test_talker_frames_on_rows_are_the_plain_frames(tiny_parts: Parts) -> None:
    """Greedy, with a repetition penalty: the talker LM on cache rows, the predictor's frame
    as one step and the batched choice give the plain path's codes, frame after frame."""
    thinker = ThinkerRunner(*tiny_parts["thinker"])
    model, config = tiny_parts["talker"]
    greedy, penalised = Sampling(), Sampling(repetition_penalty=1.3)
    plain = TalkerRunner(model, config, codec_sampling=penalised, predictor_sampling=greedy)
    rowed = TalkerRunner(
        model,
        config,
        codec_sampling=penalised,
        predictor_sampling=greedy,
        decoder=SlotDecoder(model.model, rows=4, max_length=256, capture=False),
        predictor=FramePredictor(model, rows=4, sampling=greedy, capture=False),
        reserve=16,
    )

    def opened(runner: TalkerRunner, prompt: ThinkerPrompt) -> TalkerState:
        return open_talker(thinker, runner, prompt, reply_tokens=3)

    prompts = [text_prompt("Be brief."), text_prompt("Answer at length, " * 6)]
    alone = [opened(plain, p) for p in prompts]
    batched = [opened(rowed, p) for p in prompts]
    for _ in range(6):
        expected = plain.predict_batch(alone)
        got = rowed.predict_batch(batched)
        for want, have in zip(expected, got, strict=True):
            assert want is not None and have is not None
            assert want.tolist() == have.tolist()
        plain.advance_batch(alone, [c for c in expected if c is not None])
        rowed.advance_batch(batched, [c for c in got if c is not None])
    assert [s.codes_seen for s in batched] == [s.codes_seen for s in alone]
    for state in batched:
        rowed.release(state)
    assert rowed.decoder is not None and rowed.decoder.cache.in_use == 0


def test_a_prefill_through_the_fused_experts_is_the_plain_prefill(tiny_parts: Parts) -> None:
    """With grouped_mm, prefills (hundreds of tokens) take the fused experts too."""
    model, config = build_part("thinker", tiny=True)
    prompt = text_prompt("Answer at length, " * 20)
    assert len(prompt.input_ids) > 64
    before, hidden = ThinkerRunner(model, config).prefill(prompt)
    install_fused_moe(model)
    after, fused = ThinkerRunner(model, config).prefill(prompt)
    np.testing.assert_allclose(fused.states, hidden.states, atol=1e-5)
    assert after.next_token == before.next_token


def test_the_step_benchmark_runs_on_the_tiny_model() -> None:
    from loadtest.omni_steps import main

    argv = ["--tiny", "--device", "cpu", "--dtype", "float32", "--batches", "1,2"]
    report = main([*argv, "--parts", "thinker,talker"])  # Code2Wav's: test_code2wav_graphs
    for part in ("thinker_step", "talker_frame"):
        assert report[part]["plain_b1_ms"] > 0 and report[part]["rows_b2_ms"] > 0
