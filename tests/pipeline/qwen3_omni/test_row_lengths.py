"""Decode attention over length buckets: a step that reads only the positions its rows hold
gives what a step over whole rows gives, and what each request's own plain step gives, as
rows of different lengths join, cross a bucket, leave and are compacted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from transformers import DynamicCache, Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.frame_predictor import FramePredictor
from pipeline.engines.qwen3_omni.row_lengths import LengthGraphs, length_buckets
from pipeline.engines.qwen3_omni.sampling import Sampling
from pipeline.engines.qwen3_omni.slot_decoder import SlotDecoder
from pipeline.engines.qwen3_omni.step_graphs import StepGraphs
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.talker_runner import TalkerRunner
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerRunner, ThinkerState
from pipeline.engines.qwen3_omni.thinker_slots import ThinkerSlots

from .conftest import open_talker, text_prompt

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]


def test_length_buckets_double_up_to_the_row() -> None:
    assert length_buckets(8192) == [256, 512, 1024, 2048, 4096, 8192]
    assert length_buckets(4096) == [256, 512, 1024, 2048, 4096]
    assert length_buckets(300) == [256, 300]
    assert length_buckets(16) == [16]  # the code predictor's rows: whole rows
    assert length_buckets(2048, 2048) == [2048]
    with pytest.raises(ValueError, match="at least 1"):
        length_buckets(64, 0)
    with pytest.raises(ValueError, match="shortest_attention"):
        ThinkerEngine(tiny=True, shortest_attention=0)


async def test_the_stages_attend_over_the_buckets_their_setting_asks_for() -> None:
    engines = (
        ThinkerEngine(tiny=True, threads=1, decode_rows=2, max_context=512, shortest_attention=128),
        TalkerEngine(tiny=True, threads=1, decode_rows=2, max_context=256, max_frames=100),
    )
    try:
        for engine in engines:
            await engine.start()
        thinker, talker = engines
        assert isinstance(thinker, ThinkerEngine) and isinstance(talker, TalkerEngine)
        assert thinker.runner is not None and thinker.runner.slots is not None
        assert thinker.runner.slots.decoder.graphs.lengths == [128, 256, 512]
        assert talker.runner is not None and talker.runner.decoder is not None
        assert talker.runner.decoder.graphs.lengths == [256]  # 256 is the shortest by default
    finally:
        for engine in engines:
            await engine.close()


def spy_lengths(decoder: SlotDecoder) -> list[int]:
    """The length bucket of every step `decoder` runs, in order."""
    lengths: list[int] = []
    run = decoder.graphs.run

    def counted(count: int, length: int) -> Any:
        lengths.append(length)
        return run(count, length)

    decoder.graphs.run = counted  # type: ignore[method-assign]
    return lengths


def test_bucketed_thinker_steps_are_whole_row_steps_and_plain_steps(tiny_parts: Parts) -> None:
    """Three requests of 16, 24 and 123 positions over rows of 256 (buckets 16 ... 256): each
    step's hidden states and logits are the whole-row step's, its tokens the plain path's."""
    model, config = tiny_parts["thinker"]
    runner = ThinkerRunner(model, config)

    def slots(shortest: int) -> ThinkerSlots:
        return ThinkerSlots(
            model,
            rows=4,
            max_length=256,
            accept_layer=runner.accept_layer,
            reserve=32,
            capture=False,
            shortest=shortest,
        )

    bucketed, whole = slots(16), slots(256)
    assert bucketed.decoder.graphs.lengths == [16, 32, 64, 128, 256]
    assert whole.decoder.graphs.lengths == [256]
    attended = spy_lengths(bucketed.decoder)
    prompts = {
        "short": text_prompt("x"),
        "mid": text_prompt("Be brief."),
        "long": text_prompt("Answer at length, " * 6),
        "again": text_prompt("y"),
    }
    alone = {name: runner.prefill(p)[0] for name, p in prompts.items()}
    states = {way: {name: runner.prefill(p)[0] for name, p in prompts.items()} for way in "bw"}
    assert [alone[n].length for n in ("short", "mid", "long")] == [16, 24, 123]
    joins = {0: ["short", "mid"], 3: ["long"], 12: ["again"]}
    leaves = {6: "short", 10: "long"}  # each moves the last row into its own
    active: list[str] = []
    expected: list[int] = []

    def stepped(way: ThinkerSlots, own: dict[str, ThinkerState]) -> tuple[Any, torch.Tensor]:
        seen: list[torch.Tensor] = []

        def choose(chosen: list[ThinkerState], logits: torch.Tensor) -> list[int]:
            seen.append(logits.clone())
            return runner._choose_rows(chosen, logits, 0)

        batch = [own[name] for name in active]
        assert all(way.seat(state) for state in batch)
        return way.step(batch, choose).numpy(), seen[0]

    for step in range(20):
        active += joins.get(step, [])
        if step in leaves:
            active.remove(leaves[step])
            for way, own in ((bucketed, states["b"]), (whole, states["w"])):
                way.release(own[leaves[step]], keep=False)
        longest = max(alone[name].length for name in active) + 1
        expected.append(next(n for n in bucketed.decoder.graphs.lengths if n >= longest))
        hidden, logits = stepped(bucketed, states["b"])
        whole_hidden, whole_logits = stepped(whole, states["w"])
        np.testing.assert_allclose(hidden, whole_hidden, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(logits, whole_logits, atol=1e-5, rtol=1e-4)
        for row, name in enumerate(active):
            plain = runner.step(alone[name])
            np.testing.assert_allclose(hidden[row], plain.states[0], atol=1e-5, rtol=1e-4)
    assert attended == expected
    assert {32, 64, 128, 256} <= set(attended)  # joined, crossed and left buckets
    for name, reference in alone.items():
        assert states["b"][name].generated == states["w"][name].generated == reference.generated


def test_bucketed_talker_frames_are_the_plain_frames(tiny_parts: Parts) -> None:
    """Greedy, with a repetition penalty: the talker LM on rows attending over buckets of
    4 ... 64 positions gives the plain path's codes, frame after frame, as its rows cross
    from the 32 bucket to the 64 one and one leaves mid-way."""
    thinker = ThinkerRunner(*tiny_parts["thinker"])
    model, config = tiny_parts["talker"]
    greedy, penalised = Sampling(), Sampling(repetition_penalty=1.3)
    plain = TalkerRunner(model, config, codec_sampling=penalised, predictor_sampling=greedy)
    decoder = SlotDecoder(model.model, rows=4, max_length=64, capture=False, shortest=4)
    attended = spy_lengths(decoder)
    rowed = TalkerRunner(
        model,
        config,
        codec_sampling=penalised,
        predictor_sampling=greedy,
        decoder=decoder,
        predictor=FramePredictor(model, rows=4, sampling=greedy, capture=False),
        reserve=24,
    )
    prompts = [text_prompt("Be brief."), text_prompt("Answer at length, " * 6), text_prompt("x")]
    alone = [open_talker(thinker, plain, p, reply_tokens=3) for p in prompts]
    batched = [open_talker(thinker, rowed, p, reply_tokens=3) for p in prompts]
    for frame in range(20):
        if frame == 8:  # the first leaves: the last row moves into its place
            rowed.release(batched.pop(0))
            alone.pop(0)
        expected = plain.predict_batch(alone)
        got = rowed.predict_batch(batched)
        for want, have in zip(expected, got, strict=True):
            assert want is not None and have is not None
            assert want.tolist() == have.tolist()
        plain.advance_batch(alone, [c for c in expected if c is not None])
        rowed.advance_batch(batched, [c for c in got if c is not None])
    assert [s.codes_seen for s in batched] == [s.codes_seen for s in alone]
    assert {32, 64} <= set(attended) and max(attended) == 64
    for state in batched:
        rowed.release(state)
    assert decoder.cache.in_use == 0 and decoder.cache.lengths == [0] * 4


def test_a_row_past_its_end_is_refused_before_the_device_writes(tiny_parts: Parts) -> None:
    """A request that outgrows its row (more steps than its reserve) fails with the figures,
    not with an index past the cache (a device-side assert on a GPU)."""
    model, _ = tiny_parts["thinker"]
    decoder = SlotDecoder(model.model, rows=2, max_length=32, capture=False, shortest=8)
    config: Any = model.model.config
    heads, dim = int(config.num_key_value_heads), int(config.head_dim)
    cache = DynamicCache()
    for layer in range(len(model.model.layers)):
        cache.update(torch.randn(1, heads, 30, dim), torch.randn(1, heads, 30, dim), layer)
    owner = object()
    assert decoder.cache.take(owner, cache, 32) == 0
    embeds = torch.randn(1, int(config.hidden_size))
    with torch.inference_mode():
        for position in (30, 31):
            decoder.step([owner], embeds, [position])
        assert decoder.cache.lengths[0] == 32
        with pytest.raises(ValueError, match="33 positions is longer than a cache row"):
            decoder.step([owner], embeds, [32])
    assert decoder.cache.lengths[0] == 32


@dataclass
class FakeGraph:
    """Stands for a captured step on a CPU: a replay runs the step again."""

    step: Any
    size: int
    replays: list[int] = field(default_factory=list)

    def replay(self) -> None:
        self.replays.append(self.size)


def test_one_graph_per_batch_and_length_bucket_is_captured_at_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captured: list[tuple[int, int]] = []

    def record(self: StepGraphs[Any], size: int) -> tuple[Any, Any]:
        outputs = self.step(size)  # the fake step returns its (batch, length)
        captured.append(outputs)
        return FakeGraph(self.step, size), outputs

    monkeypatch.setattr(StepGraphs, "_record", record)
    steps: list[tuple[int, int]] = []

    def step(batch: int, length: int) -> tuple[int, int]:
        steps.append((batch, length))
        return batch, length

    graphs = LengthGraphs(
        step, largest=8, lengths=[64, 128, 256], device=torch.device("cpu"), capture=True
    )
    assert graphs.count == 4 * 3
    graphs.warm()
    assert sorted(captured) == sorted((b, n) for b in (1, 2, 4, 8) for n in (64, 128, 256))
    graphs.warm()  # captured once
    assert len(captured) == 12
    assert graphs.length(65) == 128 and graphs.length(64) == 64
    assert graphs.run(3, graphs.length(200)) == (4, 256)  # the capture's own outputs
    assert len(captured) == len(steps) == 12  # a replay: no capture, no step run
