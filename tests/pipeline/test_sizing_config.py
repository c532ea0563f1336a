"""The graph file's sizing settings: `auto` or an integer, refused at load with file, line
and field where they are malformed or where the stages sharing a GPU disagree."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.graph_config import GraphConfigError, load_graph, parse_graph

CONFIGS = Path(__file__).resolve().parents[2] / "pipeline" / "configs"

OMNI = """\
name: g
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {{decode_rows: auto, kv_share: {thinker_share}, shares_gpu_with: [talker]}}
    placement: {{devices: ["cuda:0"]}}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {{decode_rows: {talker_rows}, {talker_extra}}}
    placement: {{devices: ["cuda:0"]}}
edges: [{{from: thinker, to: talker}}]
outputs: [talker]
"""


def omni(thinker_share: float = 0.85, talker_rows: str = "auto", talker_extra: str = "") -> str:
    extra = talker_extra or "kv_share: 0.15, shares_gpu_with: [thinker]"
    return OMNI.format(thinker_share=thinker_share, talker_rows=talker_rows, talker_extra=extra)


def test_the_shipped_gpu_graphs_size_to_the_card() -> None:
    thinker, talker, _ = load_graph(CONFIGS / "qwen3_omni.yaml").stages
    assert thinker.engine_args["decode_rows"] == "auto"
    assert thinker.engine_args["session_kv_tokens"] == "auto"
    assert talker.engine_args["decode_rows"] == "auto"
    assert thinker.engine_args["kv_share"] + talker.engine_args["kv_share"] <= 1
    load_graph(CONFIGS / "qwen3_omni_2gpu.yaml")
    (moshi,) = load_graph(CONFIGS / "moshi.yaml").stages
    assert moshi.engine_args["rows"] == "auto" and moshi.engine_args["max_rows"] == 64
    assert parse_graph(omni(), "g.yaml").stages[0].engine_args["kv_share"] == 0.85


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (omni(talker_rows="lots"), 9, "stages.1.engine_args.decode_rows", "'auto' or an integer"),
        (omni(talker_rows="-2"), 9, "stages.1.engine_args.decode_rows", "not -2"),
        (omni(thinker_share=1.5), 5, "stages.0.engine_args.kv_share", "number in (0, 1]"),
        (
            omni(talker_extra="max_rows: 0"),
            9,
            "stages.1.engine_args.max_rows",
            "an integer >= 1",
        ),
        (
            omni(talker_extra="kv_share: 0.3, shares_gpu_with: [thinker]"),
            9,
            "stages.1.engine_args.kv_share",
            "sum to 1.15, more than 1",
        ),
        (
            omni(talker_extra="kv_share: 0.15, shares_gpu_with: [vocoder]"),
            9,
            "stages.1.engine_args.shares_gpu_with",
            "must list parts of thinker, talker, code2wav",
        ),
        (
            omni(talker_extra="kv_share: 0.15"),
            9,
            "stages.1.engine_args.shares_gpu_with",
            "cuda:0 also holds ['thinker']",
        ),
        (
            omni(
                talker_extra="kv_share: 0.15, shares_gpu_with: [thinker], "
                "gpu_memory_utilization: 0.8"
            ),
            9,
            "stages.1.engine_args.gpu_memory_utilization",
            "different gpu_memory_utilization (0.8, 0.9)",
        ),
    ],
)
def test_bad_sizing_names_line_and_field(text: str, line: int, field: str, message: str) -> None:
    with pytest.raises(GraphConfigError) as info:
        parse_graph(text, "g.yaml")
    assert info.value.field == field
    assert info.value.line == line
    assert message in str(info.value)
    assert str(info.value).startswith(f"g.yaml:{line}: {field}: ")


def test_integer_rows_without_shares_are_checked_against_the_card_alone() -> None:
    """A benchmark's graph (loadtest/omni_bench.py) asks for rows on each stage and states
    no share: each is a demand checked at start, not a contradiction at load."""
    text = OMNI.replace(
        "{decode_rows: auto, kv_share: {thinker_share}, shares_gpu_with: [talker]}",
        "{decode_rows: 16}",
    ).format(talker_rows=16, talker_extra="max_rows: 32")
    parse_graph(text, "g.yaml")
