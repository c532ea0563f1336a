"""Graph files: a good one loads; bad ones say file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.graph_config import DEFAULT_HANG_S, GraphConfigError, load_graph, parse_graph

FIXTURES = Path(__file__).parent / "fixtures"

BASE = """\
name: g
stages:
  - name: a
    engine: fake
  - name: b
    engine: fake
edges:
  - {from: a, to: b}
outputs: [b]
"""


def test_a_good_graph_loads() -> None:
    graph = load_graph(FIXTURES / "good.yaml")
    assert [s.name for s in graph.stages] == ["thinker", "talker", "code2wav"]
    assert graph.stage("thinker").placement.process == "worker"
    assert graph.stage("thinker").engine_args == {"max_new_tokens": 32}
    assert graph.upstream("talker")[0].chunk == 4
    assert graph.entry_stages() == ["thinker"]
    assert graph.outputs == ("thinker", "code2wav")
    assert graph.stage("thinker").hang_s == DEFAULT_HANG_S == 5.0
    slow = parse_graph(
        BASE.replace("engine: fake\n  - name: b", "engine: fake\n    hang_s: 30\n  - name: b")
    )
    assert slow.stage("a").hang_s == 30.0


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (
            BASE.replace("engine: fake\n  - name: b", "engine: fake\n    colour: red\n  - name: b"),
            5,
            "stages.0.colour",
            "unknown field",
        ),
        (
            BASE.replace("{from: a, to: b}", "{from: a, to: c}"),
            8,
            "edges.0.to",
            "no stage named 'c'",
        ),
        (BASE.replace("outputs: [b]", "outputs: [z]"), 9, "outputs.0", "no stage named 'z'"),
        (BASE.replace("name: b", "name: a"), 5, "stages.1.name", "defined twice"),
        (
            BASE.replace("{from: a, to: b}", "{from: a, to: b, chunk: 0}"),
            8,
            "edges.0.chunk",
            "greater than or equal to 1",
        ),
        (
            BASE.replace("{from: a, to: b}", "{from: a, to: b, transform: 'nope:fn'}"),
            8,
            "edges.0.transform",
            "cannot import module 'nope'",
        ),
        (
            BASE.replace(
                "{from: a, to: b}", "{from: a, to: b, transform: 'pipeline.transforms:x'}"
            ),
            8,
            "edges.0.transform",
            "module 'pipeline.transforms' has no 'x'",
        ),
        (
            BASE.replace("process: main", "").replace(
                "engine: fake\n  - name: b",
                "engine: fake\n    placement: {process: gpu}\n  - name: b",
            ),
            5,
            "stages.0.placement.process",
            "'main', 'worker' or 'remote'",
        ),
        (
            BASE.replace("  - {from: a, to: b}\n", "  - {from: a, to: b}\n  - {from: b, to: a}\n"),
            7,
            "edges",
            "cycle: a -> b -> a",
        ),
        (BASE.replace("outputs: [b]", "outputs: []"), 9, "outputs", "at least 1"),
        (
            BASE.replace("engine: fake\n  - name: b", "engine: fake\n    hang_s: 0\n  - name: b"),
            5,
            "stages.0.hang_s",
            "greater than 0",
        ),
    ],
)
def test_bad_graphs_name_line_and_field(text: str, line: int, field: str, message: str) -> None:
    with pytest.raises(GraphConfigError) as info:
        parse_graph(text, "graphs/g.yaml")
    err = info.value
    assert str(err).startswith(f"graphs/g.yaml:{line}: {field}: "), str(err)
    assert message in str(err)


def test_not_yaml_or_not_a_mapping() -> None:
    with pytest.raises(GraphConfigError, match=r"^x.yaml:\d+: not valid YAML"):
        parse_graph("name: g\nstages: [\n", "x.yaml")
    with pytest.raises(GraphConfigError, match="a graph file is a mapping"):
        parse_graph("- just a list\n", "x.yaml")
    with pytest.raises(GraphConfigError, match="cannot read"):
        load_graph("/nonexistent/graph.yaml")
