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

    python -m loadtest.omni_steps                                   # full size, on the GPU
    python -m loadtest.omni_steps --tiny --device cpu --dtype float32 --batches 1,2
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

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

NEVER = 10**9
"""min_frames that keeps codec EOS away (random weights choose it at any time)."""


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
    slots.warm()
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
    predictor = FramePredictor(model, rows=rows, sampling=PREDICTOR_SAMPLING)
    decoder.graphs.warm()
    predictor.graphs.warm()
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--batches", default="1,4,10,16")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    thinker, handover = thinker_steps(args)
    talker = talker_frames(args, handover)
    report = {
        "argv": vars(args),
        "torch": torch.__version__,
        "thinker_step": thinker,
        "talker_frame": talker,
    }
    for part, figures in (("Thinker step", thinker), ("Talker frame", talker)):
        print(f"{part}: plain (batch 1) {figures['plain_b1_ms']:.1f} ms")
        for batch in args.batches:
            print(f"  rows, batch {batch:2d}: {figures[f'rows_b{batch}_ms']:.1f} ms")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=2)
    return report


if __name__ == "__main__":
    main()
