"""Benchmark: one Qwen3-Omni decode step, plain transformers against cache rows, per batch size.

The graph benchmark (`omni_bench`) measures what a user gets; this one isolates the step that
decides it. In one process, the Thinker's and the Talker's steps are timed two ways:

- plain: transformers' forward with a DynamicCache per request, one request (what
  `decode_rows: 0` runs);
- rows: the same model on static cache rows (`decode_rows`), fused MoE experts, and on a GPU
  the step captured as a CUDA graph, at each batch size asked for.

A Talker "frame" is the talker LM step plus the code predictor's 15 codes (what one 80 ms
codec frame costs). Random weights; prompts are text only (the step does not depend on what
the prompt held, only on its length).

Code2Wav decodes a batch of windows two ways: eager (`model(codes)` at the batch's longest
window) and at fixed shapes (`code2wav_graphs`: the engine's window lengths and batch
buckets, captured as CUDA graphs on a GPU), for a first chunk (5 frames, no context) and a
full window (25 frames after 25 of context). Both include the copy of the audio to the host,
as the engine pays it.

`--parts histories` times the Thinker's and the talker LM's cache-row steps at long histories,
attending over whole rows against length buckets, step by step (omni_histories.py).

    python -m loadtest.omni_steps                                   # full size, on the GPU
    python -m loadtest.omni_steps --tiny --device cpu --dtype float32 --batches 1,2
    python -m loadtest.omni_steps --parts code2wav --batches 1,4,10 # Code2Wav alone
    python -m loadtest.omni_steps --parts histories --max-context 8192 --repeats 50 \
        --history-rows 1,8,32 --histories 1000,4000,8000           # whole rows vs buckets
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipeline.engines.qwen3_omni.code2wav_runner import Code2WavRunner, window_lengths
from pipeline.engines.qwen3_omni.config import TOKENS
from pipeline.engines.qwen3_omni.frame_predictor import FramePredictor
from pipeline.engines.qwen3_omni.fused_moe import install_fused_moe
from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.slot_decoder import SlotDecoder
from pipeline.engines.qwen3_omni.stage import DTYPES
from pipeline.engines.qwen3_omni.talker_runner import (
    PREDICTOR_SAMPLING,
    TalkerPrompt,
    TalkerRunner,
    TalkerState,
)
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner
from pipeline.engines.qwen3_omni.thinker_slots import ThinkerSlots
from pipeline.engines.qwen3_omni.weights import build_part

from . import omni_histories

NEVER = 10**9
"""min_frames that keeps codec EOS away (random weights choose it at any time)."""

PARTS = ("thinker", "talker", "code2wav")
"""What runs by default; `histories` runs when asked for."""
ALL_PARTS = (*PARTS, "histories")
CODE2WAV_WINDOWS = {"first": (5, 0), "full": (50, 25)}
"""Code2Wav windows timed: (frames, of which left context), as the engine's defaults cut
them (first_chunk 5, chunk 25, left_context 25)."""


def prompt(index: int) -> ThinkerPrompt:
    instructions = "You are a helpful voice assistant. " * (3 + index)
    ids = chat_prompt(
        ByteVocab(), instructions=instructions, history=[], audio_tokens=0, text="Hello. " * 20
    )
    return ThinkerPrompt(ids)


def timed_ms(step: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Mean wall time of `step` after one untimed call, the device drained around it."""

    def drain() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step()
    drain()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    drain()
    return (time.perf_counter() - started) / repeats * 1000


def thinker_steps(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    model, config = build_part(
        "thinker", tiny=args.tiny, dtype=DTYPES[args.dtype], device=args.device
    )
    device = next(model.parameters()).device
    plain = ThinkerRunner(model, config)
    state = plain.prefill(prompt(0))[0]
    out: dict[str, Any] = {"plain_b1_ms": timed_ms(lambda: plain.step(state), args.repeats, device)}
    install_fused_moe(model)
    slots = ThinkerSlots(
        model,
        rows=max(args.batches),
        max_length=args.max_context,
        accept_layer=plain.accept_layer,
        reserve=args.repeats + 2,
    )
    began = time.perf_counter()
    slots.warm()
    out["warm_s"] = time.perf_counter() - began  # capture (and compile) of every bucket
    rowed = ThinkerRunner(model, config, slots=slots)
    for batch in args.batches:
        states = [rowed.prefill(prompt(i))[0] for i in range(batch)]
        ms = timed_ms(lambda: rowed.step_batch(states), args.repeats, device)  # noqa: B023
        out[f"rows_b{batch}_ms"] = ms
        out[f"rows_b{batch}_tokens_per_s"] = batch * 1000 / ms
        for done in states:
            rowed.release(done)
    # what the Talker's prompt needs, from the same Thinker
    tts = plain.special_embeddings([TOKENS["tts_bos"], TOKENS["tts_eos"], TOKENS["tts_pad"]])
    thinking, said = plain.prefill(prompt(0))
    reply = [plain.step(thinking).states for _ in range(4)]
    return out, (TalkerPrompt(said.token_ids, said.states, tts), reply)


def talker_frames(args: argparse.Namespace, handover: Any) -> dict[str, Any]:
    talker_prompt, reply = handover
    model, config = build_part(
        "talker", tiny=args.tiny, dtype=DTYPES[args.dtype], device=args.device
    )
    device = next(model.parameters()).device

    def opened(runner: TalkerRunner) -> TalkerState:
        state = runner.open(talker_prompt)
        for states in reply:
            runner.add_reply(state, states)
        runner.prefill(state)
        return state

    def frame(runner: TalkerRunner, states: list[TalkerState]) -> None:
        codes = runner.predict_batch(states)
        runner.advance_batch(states, [c for c in codes if c is not None])

    plain = TalkerRunner(model, config, min_frames=NEVER)
    alone = [opened(plain)]
    out: dict[str, Any] = {
        "plain_b1_ms": timed_ms(lambda: frame(plain, alone), args.repeats, device)
    }
    install_fused_moe(model)
    rows = max(args.batches)
    decoder = SlotDecoder(model.model, rows=rows, max_length=args.max_context)
    predictor = FramePredictor(
        model, rows=rows, sampling=PREDICTOR_SAMPLING, compile=args.compile_predictor
    )
    began = time.perf_counter()
    decoder.graphs.warm()
    predictor.graphs.warm()
    out["warm_s"] = time.perf_counter() - began
    rowed = TalkerRunner(
        model,
        config,
        min_frames=NEVER,
        decoder=decoder,
        predictor=predictor,
        reserve=args.repeats + 2,
    )
    for batch in args.batches:
        states = [opened(rowed) for _ in range(batch)]
        ms = timed_ms(lambda: frame(rowed, states), args.repeats, device)  # noqa: B023
        out[f"rows_b{batch}_ms"] = ms
        out[f"rows_b{batch}_frames_per_s"] = batch * 1000 / ms
        for done in states:
            rowed.release(done)
    return out


def code2wav_windows(args: argparse.Namespace) -> dict[str, Any]:
    model, _ = build_part("code2wav", tiny=args.tiny, dtype=DTYPES[args.dtype], device=args.device)
    device = next(model.parameters()).device
    eager = Code2WavRunner(model)
    fixed = Code2WavRunner(
        model, max_batch=max(args.batches), lengths=window_lengths(5, 25, 25)
    )  # capture: on a CUDA device, as the engine does
    fixed.warm()
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"lengths": fixed.graphs.lengths}
    for name, (frames, context) in CODE2WAV_WINDOWS.items():
        for batch in args.batches:
            windows = [
                (rng.integers(0, 2048, (frames, 16), dtype=np.int32), context) for _ in range(batch)
            ]
            for way, runner in (("eager", eager), ("fixed", fixed)):
                ms = timed_ms(lambda: runner.decode_batch(windows), args.repeats, device)  # noqa: B023
                out[f"{way}_{name}_b{batch}_ms"] = ms
    return out


def print_code2wav(figures: dict[str, Any], batches: list[int]) -> None:
    print("Code2Wav window (eager / fixed shapes, captured on a GPU):")
    for name, (frames, context) in CODE2WAV_WINDOWS.items():
        for batch in batches:
            eager, fixed = (figures[f"{way}_{name}_b{batch}_ms"] for way in ("eager", "fixed"))
            print(
                f"  {name} ({frames - context} + {context} context), batch {batch:2d}: "
                f"{eager:.1f} / {fixed:.1f} ms"
            )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--batches", default="1,4,10,16")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"of {', '.join(ALL_PARTS)}; the Talker needs the Thinker",
    )
    parser.add_argument(
        "--compile-predictor",
        action="store_true",
        help="the Talker's code predictor compiled (torch.compile), then captured",
    )
    parser.add_argument("--history-rows", default="1,8,32", help="histories: rows stepped")
    parser.add_argument(
        "--histories", default="1000,4000,8000", help="histories: positions each row holds"
    )
    parser.add_argument(
        "--history-parts", default=",".join(omni_histories.PARTS), help="histories: whose steps"
    )
    parser.add_argument(
        "--shortest-attention",
        type=int,
        default=256,
        help="histories: the shortest length bucket (the stages' shortest_attention)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.history_rows = [int(r) for r in args.history_rows.split(",")]
    args.histories = [int(h) for h in args.histories.split(",")]
    args.parts = args.parts.split(",")
    args.history_parts = args.history_parts.split(",")
    if unknown := set(args.parts) - set(ALL_PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    if unknown := set(args.history_parts) - set(omni_histories.PARTS):
        parser.error(f"unknown history parts: {', '.join(sorted(unknown))}")
    if "histories" in args.parts and (why := omni_histories.check_histories(args)):
        parser.error(why)
    report: dict[str, Any] = {"argv": vars(args), "torch": torch.__version__}
    steps: list[tuple[str, dict[str, Any]]] = []
    if "thinker" in args.parts or "talker" in args.parts:
        report["thinker_step"], handover = thinker_steps(args)
        steps.append(("Thinker step", report["thinker_step"]))
        if "talker" in args.parts:
            report["talker_frame"] = talker_frames(args, handover)
            steps.append(("Talker frame", report["talker_frame"]))
    if "code2wav" in args.parts:
        report["code2wav_window"] = code2wav_windows(args)
    if "histories" in args.parts:
        report["histories"] = omni_histories.histories(args)
    for part, figures in steps:
        print(
            f"{part}: plain (batch 1) {figures['plain_b1_ms']:.1f} ms; "
            f"rows warmed in {figures['warm_s']:.1f} s"
        )
        for batch in args.batches:
            print(f"  rows, batch {batch:2d}: {figures[f'rows_b{batch}_ms']:.1f} ms")
    if "code2wav" in args.parts:
        print_code2wav(report["code2wav_window"], args.batches)
    if "histories" in args.parts:
        omni_histories.print_histories(report["histories"], args)
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=2)
    return report


if __name__ == "__main__":
    main()
