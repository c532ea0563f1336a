"""Sizing Moshi to its GPU: how many sessions' cache windows fit beside the weights.

A session holds a row of the main transformer's ring cache (`window` positions over every
layer: ~1.5 GiB at full size, a 3,000-frame window), of the depth transformer's (one
frame's codebooks: a few hundred KiB) and of Mimi's streaming state in both directions
(mimi_stream.py: its two transformers' rings of 256 positions and its convolutions'
contexts, 8.1 MiB in bf16). Moshi is one stage with the GPU to itself, so its own weights,
measured once loaded, are the device's. `HEADROOM` (an estimate until measured on the GPU):
the CUDA context, activations, the CUDA graphs of every batch bucket, the allocator's slack.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...memory_plan import GIB, Auto, MemoryPlan, SizingInputs, plan_memory
from ..gpu_memory import DeviceFigures, SizingSettings, kv_token_bytes
from .mimi_stream import codec_row_bytes

log = logging.getLogger("parley.pipeline.moshi.memory")

HEADROOM = 2 * GIB


def row_bytes(config: Any, dtype: torch.dtype) -> int:
    """One session's state: its main ring (`sliding_window` positions), its depth ring and
    its codec's."""
    codebooks = int(config.num_codebooks)
    main = kv_token_bytes(config, dtype) * int(config.sliding_window)
    depth = kv_token_bytes(config.depth_decoder_config, dtype) * codebooks
    codec = codec_row_bytes(config.audio_encoder_config, codebooks=codebooks, dtype=dtype)
    return main + depth + codec


def plan_rows(
    *,
    config: Any,
    dtype: torch.dtype,
    device: str,
    figures: DeviceFigures,
    settings: SizingSettings,
    rows: int | Auto,
) -> MemoryPlan:
    """Moshi's rows on this card, logged (one line); MemoryRefused with the figures."""
    plan = plan_memory(
        SizingInputs(
            stage="moshi",
            device=device,
            total=figures.total,
            free=figures.free,
            weights=figures.allocated,
            headroom=HEADROOM,
            row_bytes=row_bytes(config, dtype),
            context=int(config.sliding_window),
            rows=rows,
            max_rows=settings.max_rows,
            utilization=settings.utilization,
            kv_share=settings.kv_share,
        )
    )
    log.info("%s", plan.line())
    return plan
