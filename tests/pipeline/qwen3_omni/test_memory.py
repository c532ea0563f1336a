"""The Qwen3-Omni stages size their rows at start from the device's figures.

There is no GPU in CI: the engines are given a `memory_query` (the seam `gpu_memory.py`
offers), a fake device whose allocator holds `weights` once the stage's weights are loaded,
and size themselves with its figures as they would with torch.cuda's."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline.engines.gpu_memory import DeviceFigures
from pipeline.engines.qwen3_omni.memory import HEADROOM
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.memory_plan import GIB, MemoryRefused

TOKEN = 3 * 2 * 16 * 2 * 4
"""The tiny Thinker's KV a token: 3 layers x 2 KV heads x head dim 16 x (K, V) x float32."""
CONTEXT = 256
UNIT = CONTEXT * TOKEN * 3 // 2
"""A row and, with `auto` token caches, a quarter of its context in each of them."""
WEIGHTS = GIB


@dataclass
class FakeDevice:
    """A GPU's figures: nothing held until the first query (before the weights), then
    `weights` held and `free` left."""

    total: int
    free: int
    queries: int = 0

    def __call__(self, device: str) -> DeviceFigures:
        self.queries += 1
        held = 0 if self.queries == 1 else WEIGHTS
        return DeviceFigures(total=self.total, free=self.free, allocated=held)


def card_for(rows: float) -> FakeDevice:
    """A card whose pool (utilization 1) holds `rows` Thinker units beside weights and
    headroom."""
    total = WEIGHTS + HEADROOM["thinker"] + int(rows * UNIT)
    return FakeDevice(total=total, free=total - WEIGHTS)


async def test_the_thinker_takes_the_rows_that_fit_and_caches_that_grow_with_them() -> None:
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_context=CONTEXT,
        decode_rows="auto",
        max_rows=8,
        session_kv_tokens="auto",
        prefix_cache_tokens="auto",
        gpu_memory_utilization=1.0,
        memory_query=card_for(3.5),
    )
    try:
        await engine.start()
        assert engine.decode_rows == 3
        assert engine.runner is not None and engine.runner.slots is not None
        assert engine.runner.slots.decoder.cache.rows == 3
        assert engine.sessions is not None and engine.sessions.budget_tokens == 3 * CONTEXT // 4
        assert engine.prefix_cache_tokens == 3 * CONTEXT // 4
        plan = engine.memory_plan
        assert plan is not None and plan.weights == WEIGHTS
        assert "3 rows x 256 positions" in plan.line()
    finally:
        await engine.close()


async def test_a_thinker_asking_for_more_rows_than_fit_refuses_to_start() -> None:
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_context=CONTEXT,
        decode_rows=6,
        gpu_memory_utilization=1.0,
        memory_query=card_for(3.5),
    )
    try:
        with pytest.raises(MemoryRefused, match="6 rows asked for do not fit.*: 5 rows fit"):
            await engine.start()
    finally:
        await engine.close()


async def test_the_talker_counts_its_neighbours_weights() -> None:
    """The Talker shares its GPU with the Thinker: the Thinker's weights (counted on the meta
    device) and headroom leave it less than its own figures alone would."""
    talker_token = 2 * 2 * 16 * 2 * 4
    total = WEIGHTS + HEADROOM["talker"] + 10 * CONTEXT * talker_token
    alone = TalkerEngine(
        tiny=True,
        threads=1,
        max_context=CONTEXT,
        max_frames=100,  # a row of CONTEXT positions leaves room for a prompt beside them
        decode_rows="auto",
        max_rows=32,
        gpu_memory_utilization=1.0,
        memory_query=FakeDevice(total=total, free=total - WEIGHTS),
    )
    try:
        await alone.start()
        assert alone.decode_rows == 10
    finally:
        await alone.close()
    beside = TalkerEngine(
        tiny=True,
        threads=1,
        max_context=CONTEXT,
        max_frames=100,
        decode_rows="auto",
        gpu_memory_utilization=1.0,
        shares_gpu_with=["thinker"],
        memory_query=FakeDevice(total=total + HEADROOM["thinker"], free=total - WEIGHTS),
    )
    try:
        with pytest.raises(MemoryRefused, match="not one cache row fits") as refused:
            await beside.start()  # the tiny Thinker's weights take more than 10 rows
        assert "this stage 1.00 GiB" in str(refused.value)
    finally:
        await beside.close()


def test_on_the_cpu_auto_means_the_cap() -> None:
    engine = ThinkerEngine(tiny=True, decode_rows="auto", max_rows=4, session_kv_tokens="auto")
    assert engine.decode_rows == 4 and engine.memory_plan is None
    with pytest.raises(ValueError, match="decode_rows must be 'auto' or an integer >= 0"):
        ThinkerEngine(tiny=True, decode_rows="many")
