"""Sizing from given figures: the full-size graphs on an 80 GB H100 and a 139 GB H200.

The cards' totals are what torch reports for them (79.11 and 139.81 GiB); the weights are the
parts' bf16 parameter bytes (Qwen3-Omni's Thinker, Talker and Code2Wav under transformers
5.x, Moshi's `moshiko`), so these are the shipped graph files' rows by arithmetic."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.memory_plan import (
    GIB,
    MemoryRefused,
    SizingInputs,
    TokenCache,
    plan_memory,
    rows_setting,
)

H100 = int(79.11 * GIB)
H200 = int(139.81 * GIB)
WEIGHTS = {"thinker": 63_446_091_304, "talker": 6_649_193_472, "code2wav": 432_033_410}
HEADROOM = {"thinker": 3 * GIB, "talker": 3 * GIB // 2, "code2wav": GIB}
THINKER_TOKEN = 48 * 4 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16: 96 KiB
TALKER_TOKEN = 20 * 2 * 128 * 2 * 2
MOSHI_ROW = 32 * 32 * 128 * 2 * 2 * 3000 + 6 * 16 * 64 * 2 * 2 * 8
MOSHI_WEIGHTS = 15_567_771_994


def omni(part: str, total: int, rows: int | str = "auto", **changes: object) -> SizingInputs:
    """A Qwen3-Omni stage as qwen3_omni.yaml ships it (utilization 0.95, shares 0.85/0.15)."""
    others = [p for p in WEIGHTS if p != part]
    thinker = part == "thinker"
    token, context = (THINKER_TOKEN, 8192) if thinker else (TALKER_TOKEN, 4096)
    caches = (
        (TokenCache("session KV", "auto", 2048), TokenCache("prefix cache", "auto", 2048))
        if thinker
        else ()
    )
    inputs = SizingInputs(
        stage=part,
        device="cuda:0",
        total=total,
        free=total - sum(WEIGHTS.values()),
        weights=WEIGHTS[part],
        headroom=HEADROOM[part],
        row_bytes=token * context,
        context=context,
        rows=rows,  # type: ignore[arg-type]
        max_rows=32,
        token_bytes=token,
        caches=caches,
        utilization=0.95,
        kv_share=0.85 if thinker else 0.15,
        neighbour_weights=sum(WEIGHTS[p] for p in others),
        neighbour_headroom=sum(HEADROOM[p] for p in others),
    )
    return dataclasses.replace(inputs, **changes)  # type: ignore[arg-type]


def moshi(total: int, rows: int | str = "auto") -> SizingInputs:
    return SizingInputs(
        stage="moshi",
        device="cuda:0",
        total=total,
        free=total - MOSHI_WEIGHTS,
        weights=MOSHI_WEIGHTS,
        headroom=2 * GIB,
        row_bytes=MOSHI_ROW,
        context=3000,
        rows=rows,  # type: ignore[arg-type]
        max_rows=64,
    )


def test_qwen3_omni_on_an_h100_holds_three_sessions_and_on_an_h200_its_cap() -> None:
    thinker, talker = plan_memory(omni("thinker", H100)), plan_memory(omni("talker", H100))
    assert (thinker.rows, talker.rows) == (3, 7)
    assert thinker.cache_tokens == {"session KV": 6144, "prefix cache": 6144}
    assert thinker.kv_bytes == 3 * 8192 * THINKER_TOKEN + 2 * 6144 * THINKER_TOKEN
    thinker, talker = plan_memory(omni("thinker", H200)), plan_memory(omni("talker", H200))
    assert (thinker.rows, talker.rows) == (32, 32)
    # the caches the file gave before sizing: 65,536 tokens each at 32 rows
    assert thinker.cache_tokens == {"session KV": 65536, "prefix cache": 65536}
    line = thinker.line()
    assert "32 rows x 8,192 positions" in line and "maximum concurrency" in line
    assert "weights 59.09 GiB (device 65.68 GiB)" in line


def test_moshi_on_an_h100_holds_37_sessions_and_on_an_h200_64() -> None:
    assert plan_memory(moshi(H100)).rows == 37
    assert plan_memory(moshi(H200)).rows == 64


def test_a_demand_that_does_not_fit_is_refused_with_the_figures() -> None:
    with pytest.raises(MemoryRefused) as refused:
        plan_memory(omni("thinker", H100, rows=32))
    message = str(refused.value)
    assert "32 rows asked for do not fit" in message
    for figure in ("total 79.11 GiB", "utilization 0.95", "weights 65.68 GiB", "3 rows fit"):
        assert figure in message
    assert plan_memory(omni("thinker", H100, rows=3)).rows == 3  # what fits is taken
    with pytest.raises(MemoryRefused, match="65 rows asked for"):
        plan_memory(moshi(H100, rows=65))


def test_auto_refuses_a_card_without_one_row() -> None:
    with pytest.raises(MemoryRefused, match="not one cache row fits.*0 rows fit"):
        plan_memory(omni("thinker", H100, utilization=0.9))  # vLLM's default leaves 0.02 GiB


def test_integer_token_caches_are_taken_before_the_rows() -> None:
    caches = (TokenCache("session KV", 65536), TokenCache("prefix cache", 0))
    plan = plan_memory(omni("thinker", H200, caches=caches))
    # 52.39 GiB share - 6 GiB of session KV = 46.39 GiB: 61 rows of 0.75 GiB, capped at 32
    assert plan.rows == 32 and plan.cache_tokens == {"session KV": 65536, "prefix cache": 0}
    with pytest.raises(MemoryRefused, match="fixed token caches 6.00 GiB"):
        plan_memory(omni("thinker", H100, caches=caches))


def test_a_card_that_something_else_fills_is_refused_at_start() -> None:
    crowded = omni("thinker", H200, free=20 * GIB)  # another process holds the rest
    with pytest.raises(MemoryRefused, match="exceed the 20.00 GiB free now"):
        plan_memory(crowded)


def test_settings_take_auto_or_an_integer() -> None:
    assert rows_setting("auto", "rows") == "auto"
    assert rows_setting(0, "rows") == 0
    for bad in (-1, True, "32", 1.5, None):
        with pytest.raises(ValueError, match="rows must be 'auto' or an integer >= 0"):
            rows_setting(bad, "rows")
