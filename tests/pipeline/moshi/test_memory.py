"""Moshi sizes its rows at start from the device's figures (a fake device: no GPU in CI)."""

from __future__ import annotations

import pytest
import torch

from pipeline.engines.gpu_memory import DeviceFigures
from pipeline.engines.moshi.duplex_engine import MoshiDuplexEngine
from pipeline.engines.moshi.frame_step import RowsFull, Sampling
from pipeline.engines.moshi.memory import HEADROOM
from pipeline.engines.moshi.mimi_stream import codec_row_bytes
from pipeline.engines.moshi.weights import moshi_config
from pipeline.memory_plan import GIB, MemoryRefused

CODEC_ROW = codec_row_bytes(
    moshi_config(tiny=True).audio_encoder_config, codebooks=8, dtype=torch.float32
)
"""Mimi's streaming state for a session (test_mimi_stream.py: what MimiFrames allocates)."""
ROW = 2 * 4 * 16 * 2 * 4 * 256 + 1 * 2 * 16 * 2 * 4 * 8 + CODEC_ROW
"""The toy model's session: its main ring (2 layers x 4 KV heads x head dim 16 x (K, V) x
float32 x a 256-frame window), its depth ring (8 codebooks) and its codec's state."""
WEIGHTS = GIB


def device_for(rows: float) -> DeviceFigures:
    total = WEIGHTS + HEADROOM + int(rows * ROW)
    return DeviceFigures(total=total, free=total - WEIGHTS, allocated=WEIGHTS)


def engine(rows: int | str, figures: DeviceFigures) -> MoshiDuplexEngine:
    return MoshiDuplexEngine(
        tiny=True,
        rows=rows,
        max_rows=8,
        gpu_memory_utilization=1.0,
        sampling=Sampling(greedy=True),
        memory_query=lambda device: figures,
    )


async def test_auto_takes_the_sessions_that_fit_and_holds_to_them() -> None:
    moshi = engine("auto", device_for(3.5))
    try:
        await moshi.start()
        assert moshi.rows == 3
        assert moshi.memory_plan is not None
        line = moshi.memory_plan.line()
        assert "3 rows x 256 positions" in line
        assert "maximum concurrency at 256 positions: 3 sessions" in line
        for n in range(3):
            moshi.open(f"s{n}")
        with pytest.raises(RowsFull, match="all 3 duplex sessions"):
            moshi.open("s3")
    finally:
        await moshi.close()


async def test_a_demand_beyond_the_card_refuses_to_start() -> None:
    moshi = engine(4, device_for(3.5))
    try:
        with pytest.raises(MemoryRefused, match="4 rows asked for do not fit.*3 rows fit"):
            await moshi.start()
    finally:
        await moshi.close()
