"""Benchmark: decode steps at long histories, whole rows against length buckets.

A cache-row step used to attend over every position of its rows (`max_context`) whatever they
held; it now attends over the smallest length bucket that holds its longest row
(`pipeline/engines/qwen3_omni/row_lengths.py`). This times both on the same rows in the same
run, step by step (the two ways alternate, so drift hits both alike): the Thinker's step and
the talker LM's step (the code predictor's rows are 16 positions and unchanged), at each row
count with every row holding `history` positions. The rows hold random keys and values: what a
step costs depends on how much of the cache it reads, not on what the cache says.

Each step is timed alone (the device drained before and after), so p95/p99 show the slow
steps; n is the number of steps timed per way. The ratio is whole-row p50 over bucketed p50.
Rows grow by one position a step, by two per pair of steps, so a history near a bucket's end
crosses into the next bucket during the run (the `attends` column lists the buckets used).

Run through `loadtest.omni_steps --parts histories` (see there for the options).
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from pipeline.engines.qwen3_omni.fused_moe import install_fused_moe
from pipeline.engines.qwen3_omni.slot_decoder import SlotDecoder
from pipeline.engines.qwen3_omni.stage import DTYPES
from pipeline.engines.qwen3_omni.weights import Part, build_part

PARTS: tuple[Part, ...] = ("thinker", "talker")
WARM_STEPS = 2
"""Untimed steps per way before each case's timed ones (the first replay of a graph)."""
WAYS = ("whole", "bucketed")


def steps_needed(args: argparse.Namespace) -> int:
    """Positions a case adds to its rows: both ways' warm and timed steps."""
    return len(WAYS) * (WARM_STEPS + int(args.repeats))


def check_histories(args: argparse.Namespace) -> str | None:
    """Why the histories cannot run in `max_context` positions; None if they can."""
    longest = max(args.histories) + steps_needed(args)
    if longest > args.max_context:
        return (
            f"a history of {max(args.histories)} plus {steps_needed(args)} timed and warm-up "
            f"steps needs {longest} positions, more than --max-context {args.max_context}"
        )
    return None


def random_cache(body: Any, history: int, generator: torch.Generator) -> DynamicCache:
    """A batch-of-one cache of `history` positions of random keys and values."""
    config = body.config
    parameter = next(body.parameters())
    size = int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", None) or size // config.num_attention_heads)
    shape = (1, int(config.num_key_value_heads), history, head_dim)
    cache = DynamicCache()
    for layer in range(len(body.layers)):
        keys, values = (
            torch.randn(shape, generator=generator).to(parameter.device, parameter.dtype)
            for _ in range(2)
        )
        cache.update(keys, values, layer)
    return cache


def stats(times_ms: list[float]) -> dict[str, float]:
    values = np.asarray(times_ms)
    out = {"n": len(values), "max": float(values.max())}
    for q in (50, 95, 99):
        out[f"p{q}"] = float(np.percentile(values, q))
    return out


def time_case(
    decoder: SlotDecoder, rows: int, history: int, args: argparse.Namespace
) -> dict[str, Any]:
    """`rows` rows of `history` positions stepped both ways, alternately."""
    generator = torch.Generator().manual_seed(rows * 100_003 + history)
    cache = random_cache(decoder.body, history, generator)
    owners = [object() for _ in range(rows)]
    for owner in owners:
        if decoder.cache.take(owner, cache, history + steps_needed(args)) is None:
            raise RuntimeError("the decoder has fewer rows than the case needs")
    del cache
    size = decoder.embeds.shape[-1]
    embeds = torch.randn(rows, size, generator=generator).to(decoder.device, decoder.embeds.dtype)
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    attends: set[int] = set()
    device = decoder.device

    def drain() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        for index in range(WARM_STEPS + args.repeats):
            for way in WAYS:
                held = [decoder.cache.row_of(owner) for owner in owners]
                positions = [decoder.cache.lengths[row] for row in held]
                if way == "bucketed":
                    attends.add(decoder.graphs.length(decoder.cache.longest(held)))
                drain()
                began = time.perf_counter()
                decoder.step(owners, embeds, positions, whole_rows=way == "whole")
                drain()
                if index >= WARM_STEPS:
                    times[way].append((time.perf_counter() - began) * 1000)
    finally:
        for owner in owners:
            decoder.cache.give_back(owner)
    figures: dict[str, Any] = {way: stats(times[way]) for way in WAYS}
    figures["attends"] = sorted(attends)
    figures["ratio_p50"] = figures["whole"]["p50"] / figures["bucketed"]["p50"]
    return figures


def part_histories(part: Part, args: argparse.Namespace) -> dict[str, Any]:
    model, _ = build_part(part, tiny=args.tiny, dtype=DTYPES[args.dtype], device=args.device)
    install_fused_moe(model)
    decoder = SlotDecoder(
        model.model,
        rows=max(args.history_rows),
        max_length=args.max_context,
        shortest=args.shortest_attention,
        name=part,
    )
    device = decoder.device
    reserved = torch.cuda.memory_reserved(device) if device.type == "cuda" else 0
    began = time.perf_counter()
    with torch.inference_mode():
        decoder.graphs.warm()
        out: dict[str, Any] = {
            "warm_s": time.perf_counter() - began,
            "graphs": decoder.graphs.count if decoder.graphs.capture else 0,
            "lengths": decoder.graphs.lengths,
        }
        if device.type == "cuda":
            out["warm_memory_mib"] = (torch.cuda.memory_reserved(device) - reserved) / 2**20
        for rows in args.history_rows:
            for history in args.histories:
                out[f"r{rows}_h{history}"] = time_case(decoder, rows, history, args)
    del decoder, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def histories(args: argparse.Namespace) -> dict[str, Any]:
    """Every part's figures, one part's model on the device at a time."""
    return {part: part_histories(part, args) for part in PARTS if part in args.history_parts}


def print_histories(report: dict[str, Any], args: argparse.Namespace) -> None:
    for part, figures in report.items():
        memory = figures.get("warm_memory_mib")
        captured = (
            f"{figures['graphs']} graphs captured in {figures['warm_s']:.1f} s"
            + (f", {memory:.0f} MiB" if memory is not None else "")
            if figures["graphs"]
            else "steps not captured"
        )
        print(
            f"{part.capitalize()} step at long histories (max_context {args.max_context}, "
            f"length buckets {', '.join(map(str, figures['lengths']))}): {captured}"
        )
        print("  rows  history    attends       way      n    p50    p95    p99    max  (ms)")
        for rows in args.history_rows:
            for history in args.histories:
                case = figures[f"r{rows}_h{history}"]
                for way in WAYS:
                    s = case[way]
                    lead = f"  {rows:4d}  {history:7d}  {'/'.join(map(str, case['attends'])):>9}"
                    if way != WAYS[0]:
                        lead = " " * len(lead)
                    line = (
                        f"{lead}  {way:>8}  {int(s['n']):5d}  {s['p50']:5.2f}  {s['p95']:5.2f}"
                        f"  {s['p99']:5.2f}  {s['max']:5.2f}"
                    )
                    if way == WAYS[-1]:
                        line += f"  ratio {case['ratio_p50']:.2f}x"
                    print(line)
