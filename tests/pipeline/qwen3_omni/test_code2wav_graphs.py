"""Code2Wav windows at fixed shapes (the GPU's captured path, run plainly here): each window
gets the audio `model(codes)` gives it alone, and every shape is prepared before a request."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from transformers import Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.code2wav import Code2WavEngine
from pipeline.engines.qwen3_omni.code2wav_graphs import WindowGraphs, rotary_tables, window_forward
from pipeline.engines.qwen3_omni.code2wav_runner import (
    Audio,
    Code2WavRunner,
    Codes,
    window_lengths,
)
from pipeline.engines.qwen3_omni.step_graphs import StepGraphs, buckets_up_to
from pipeline.engines.qwen3_omni.weights import build_part
from pipeline.types import AudioChunk, Chunk, CodecCodes, PipelineRequest, StageInput

from .conftest import turn_audio

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]
Windows = list[tuple[Codes, int]]


def windows_of(shapes: list[tuple[int, int]], seed: int = 5) -> Windows:
    """Random codes for (frames, context) windows."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 2048, (n, 16), dtype=np.int32), ctx) for n, ctx in shapes]


def assert_sounds_as(got: Audio, expected: Audio) -> None:
    """Equal to float rounding: random weights make a signal of ~1e-6, so relative to it."""
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=float(np.abs(expected).max()) * 1e-4)


class FakeGraph:
    """What a capture keeps, on a CPU: the step's output tensor, refilled in place by a
    replay from whatever the static inputs hold then (as a CUDA graph's replay does)."""

    def __init__(self, step: Callable[[int], torch.Tensor], size: int, log: list[int]) -> None:
        self.step, self.size, self.log = step, size, log
        self.outputs = step(size).clone()

    def replay(self) -> None:
        self.log.append(self.size)
        self.outputs.copy_(self.step(self.size))


@dataclass
class Captures:
    captured: list[tuple[int, int]] = field(default_factory=list)
    """(length, batch) of every capture, in order"""
    replays: dict[int, list[int]] = field(default_factory=dict)
    """per length bucket, the batch bucket of every replay, in order"""


def fake_capture(monkeypatch: pytest.MonkeyPatch) -> Captures:
    """Make StepGraphs "capture" (with FakeGraph) on a CPU, and note what it does."""
    captures = Captures()

    def record(self: StepGraphs[torch.Tensor], size: int) -> tuple[Any, torch.Tensor]:
        # a WindowGraphs step is partial(_step, codes buffer, rotary): its length is the buffer's
        length = int(self.step.args[0].shape[-1])  # type: ignore[attr-defined]
        captures.captured.append((length, size))
        graph = FakeGraph(self.step, size, captures.replays.setdefault(length, []))
        return graph, graph.outputs

    monkeypatch.setattr(StepGraphs, "_record", record)
    return captures


def test_the_fixed_shape_forward_is_the_model_s_own(tiny_parts: Parts) -> None:
    model = tiny_parts["code2wav"][0]
    generator = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for frames in (1, 5, 50):
            codes = torch.randint(0, 2048, (3, 16, frames), generator=generator)
            got = window_forward(model, codes, rotary_tables(model, frames))
            torch.testing.assert_close(got, model(codes), rtol=0, atol=0)


def test_windows_padded_to_fixed_lengths_decode_as_alone(tiny_parts: Parts) -> None:
    model = tiny_parts["code2wav"][0]
    plain = Code2WavRunner(model)
    fixed = Code2WavRunner(model, max_batch=4, lengths=[5, 15, 35])
    windows = windows_of([(5, 0), (12, 5), (35, 15)])
    alone = [plain.decode(frames, context) for frames, context in windows]
    for got, own in zip(fixed.decode_batch(windows), alone, strict=True):
        assert_sounds_as(got, own)
    # alone, a first chunk pads nothing in length (but its batch of 1 is a bucket too)
    assert_sounds_as(fixed.decode(*windows[0]), alone[0])
    # a partial window pads to the next length up
    assert_sounds_as(fixed.decode(*windows[1]), alone[1])
    # the old way, each window padded to the batch's longest, is the same
    for got, own in zip(plain.decode_batch(windows), alone, strict=True):
        assert_sounds_as(got, own)


def test_a_batch_goes_to_the_smallest_length_that_holds_its_longest(tiny_parts: Parts) -> None:
    model = tiny_parts["code2wav"][0]
    assert window_lengths(5, 25, 25) == [5, 15, 35, 50]  # the GPU graph's windows
    assert window_lengths(2, 4, 3) == [2, 6, 7]
    assert window_lengths(10, 5, 1) == [6, 10]  # a first chunk longer than `chunk` comes last
    graphs = WindowGraphs(model, lengths=[35, 5, 15, 50, 5], max_batch=4)
    assert graphs.lengths == [5, 15, 35, 50]
    assert [graphs.length_for(1, n) for n in (1, 5, 6, 15, 16, 50)] == [5, 5, 15, 15, 35, 50]
    assert graphs.length_for(4, 5) == 5
    assert graphs.length_for(5, 5) is None  # more than max_batch: the plain way
    assert graphs.length_for(1, 51) is None  # longer than any window: the plain way
    assert graphs.graphs[5].buckets == [1, 2, 4]
    # past the sliding window (72) the model's mask is no longer plain causal
    assert WindowGraphs(model, lengths=[5, 72, 73], max_batch=1).lengths == [5, 72]


def test_eager_attention_decodes_plainly() -> None:
    model, _ = build_part("code2wav", tiny=True, attn_implementation="eager")
    runner = Code2WavRunner(model, lengths=[5, 15])
    assert runner.graphs.lengths == []  # no causal flag in eager attention: no fixed shapes
    frames, context = windows_of([(5, 0)])[0]
    assert len(runner.decode(frames, context)) > 0


def test_warm_captures_every_shape_and_a_batch_replays_one(
    tiny_parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    captures = fake_capture(monkeypatch)
    model = tiny_parts["code2wav"][0]
    plain = Code2WavRunner(model)
    runner = Code2WavRunner(model, max_batch=2, lengths=[2, 6], capture=True)
    assert captures.captured == []
    runner.warm()
    assert sorted(captures.captured) == list(itertools.product([2, 6], buckets_up_to(2)))
    windows = windows_of([(2, 0), (5, 2)], seed=7)
    alone = [plain.decode(frames, context) for frames, context in windows]
    for got, own in zip(runner.decode_batch(windows), alone, strict=True):
        assert_sounds_as(got, own)
    assert captures.replays == {2: [], 6: [2]}
    # a later replay reads the codes it is given, not what the graph last held
    for (frames, context), own in zip(reversed(windows), reversed(alone), strict=True):
        assert_sounds_as(runner.decode(frames, context), own)
    assert captures.replays == {2: [1], 6: [2, 1]}
    assert len(captures.captured) == 4  # nothing captured after warm


async def test_the_engine_captures_at_start_and_streams_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captures = fake_capture(monkeypatch)
    rng = np.random.default_rng(8)
    frames = [CodecCodes(codes=rng.integers(0, 2048, (1, 16), dtype=np.int32)) for _ in range(9)]

    async def pcm(engine: Code2WavEngine) -> list[np.ndarray[Any, Any]]:
        async def feed() -> AsyncIterator[Chunk]:
            for frame in frames:
                yield frame

        await engine.start()
        try:
            request = PipelineRequest(request_id="c", audio=turn_audio(0.1))
            out = engine.generate("c", StageInput(request, feed()))
            return [c.pcm async for c in out if isinstance(c, AudioChunk)]
        finally:
            await engine.close()

    settings: dict[str, Any] = {
        "first_chunk": 2, "chunk": 4, "left_context": 2, "max_batch": 2, "normalize_peak": 0.5
    }  # fmt: skip
    plain = await pcm(Code2WavEngine(tiny=True, capture_graphs=False, **settings))
    assert captures.captured == []
    graphed = await pcm(Code2WavEngine(tiny=True, capture_graphs=True, **settings))
    assert sorted(captures.captured) == [(2, 1), (2, 2), (6, 1), (6, 2)]  # all at start
    # windows of 2, 6 (4 new) and the flush's 5 (3 new), which pads to 6
    assert captures.replays == {2: [1], 6: [1, 1]}
    assert [len(c) for c in graphed] == [len(c) for c in plain]
    for got, own in zip(graphed, plain, strict=True):
        assert np.array_equal(got, own)


def test_the_step_benchmark_times_code2wav_windows_both_ways() -> None:
    from loadtest.omni_steps import main

    argv = ["--tiny", "--device", "cpu", "--dtype", "float32", "--batches", "1", "--repeats", "1"]
    report = main([*argv, "--parts", "code2wav"])
    figures = report["code2wav_window"]
    assert figures["lengths"] == [5, 15, 35, 50]
    for way, window in itertools.product(("eager", "fixed"), ("first", "full")):
        assert figures[f"{way}_{window}_b1_ms"] > 0
    assert "thinker_step" not in report
