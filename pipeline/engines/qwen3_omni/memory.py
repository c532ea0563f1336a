"""Sizing a Qwen3-Omni stage to its GPU: the figures `memory_plan.plan_memory` decides from.

The three stages may share one GPU (`shares_gpu_with`: the parts of the other stages placed
on the same device). A stage measures its own weights once loaded and counts its neighbours'
from their configurations on the meta device (they may not have started yet, or may be
restarting), fused MoE copies included: under transformers 4.x `install_fused_moe` stacks a
copy of every expert beside the modules' own weights (fused_moe.py), and a neighbour with
decode rows holds that copy too.

`HEADROOM` is each stage's memory beside weights and KV, by estimate until measured on the
GPU: its CUDA (MPS) context, activations (the Thinker's prefill chunks, their prompts' KV
before it moves into rows, logits), its CUDA graphs and the allocator's slack.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Sequence
from typing import Any, get_args

import torch

from ...memory_plan import GIB, Auto, MemoryPlan, SizingInputs, TokenCache, plan_memory
from ..gpu_memory import DeviceFigures, SizingSettings, kv_token_bytes
from .fused_moe import FusedForward, install_fused_moe
from .weights import Part, meta_part

log = logging.getLogger("parley.pipeline.qwen3_omni.memory")

PARTS: tuple[Part, ...] = get_args(Part)
HEADROOM: dict[Part, int] = {"thinker": 3 * GIB, "talker": 3 * GIB // 2, "code2wav": GIB}
CACHE_TOKENS_PER_ROW_DIVISOR = 4
"""An `auto` token cache (session KV, prefix cache) holds a quarter of a row's context per
row: at 32 rows of 8,192 positions, 65,536 tokens, what the graph file asked for before."""


@functools.cache
def part_weight_bytes(part: Part, model_path: str | None, tiny: bool, dtype: torch.dtype) -> int:
    """The bytes a stage of `part` holds for its weights (with decode rows, for the stages
    that have them), counted on the meta device."""
    module = meta_part(part, model_path=model_path, tiny=tiny, dtype=dtype)
    held = sum(t.nbytes for t in itertools.chain(module.parameters(), module.buffers()))
    if part != "code2wav":
        install_fused_moe(module)
        for sub in module.modules():
            fused = sub.forward
            if isinstance(fused, FusedForward) and fused.with_logits:  # 4.x: a stacked copy
                held += fused.weights.gate_up.nbytes + fused.weights.down.nbytes
    return int(held)


def neighbours_setting(value: object) -> tuple[Part, ...]:
    if not isinstance(value, list | tuple) or any(p not in PARTS for p in value):
        raise ValueError(f"shares_gpu_with must list parts of {', '.join(PARTS)}, not {value!r}")
    return tuple(value)


def plan_stage(
    *,
    part: Part,
    device: str,
    figures: DeviceFigures,
    settings: SizingSettings,
    text_config: Any,
    dtype: torch.dtype,
    rows: int | Auto,
    context: int,
    neighbours: Sequence[Part],
    model_path: str | None,
    tiny: bool,
    caches: tuple[TokenCache, ...] = (),
) -> MemoryPlan:
    """The stage's plan, logged (one line); MemoryRefused with the figures if it cannot fit."""
    token = kv_token_bytes(text_config, dtype)
    plan = plan_memory(
        SizingInputs(
            stage=part,
            device=device,
            total=figures.total,
            free=figures.free,
            weights=figures.allocated,
            headroom=HEADROOM[part],
            row_bytes=token * context,
            context=context,
            rows=rows,
            max_rows=settings.max_rows,
            token_bytes=token,
            caches=caches,
            utilization=settings.utilization,
            kv_share=settings.kv_share,
            neighbour_weights=sum(
                part_weight_bytes(p, model_path, tiny, dtype) for p in neighbours
            ),
            neighbour_headroom=sum(HEADROOM[p] for p in neighbours),
        )
    )
    log.info("%s", plan.line())
    return plan
