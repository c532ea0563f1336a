"""Engine limits that contradict each other are refused when the graph file is loaded,
naming the file, the line and the field; the shipped graph files pass; the engines refuse
the same arguments when made in code."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from pipeline.engine_limits import DEFAULTS
from pipeline.engines.cascade.thinker import ThinkerEngine as CascadeThinker
from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.graph_config import GraphConfigError, load_graph

CONFIGS = Path(__file__).parents[2] / "pipeline" / "configs"

GRAPH = """\
name: limits
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {{tiny: true, max_context: 1024,
                  {thinker}}}
  - name: talker
    engine: qwen3_omni.talker
    engine_args:
      tiny: true
      max_context: 2048
      {talker}
edges:
  - {{from: thinker, to: talker}}
outputs: [talker]
"""


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_the_shipped_graph_files_are_consistent(path: Path) -> None:
    load_graph(path)


@pytest.mark.parametrize(
    ("thinker", "talker", "line", "field", "words"),
    [
        ("session_kv_max_tokens: 2048", "", 6, "stages.0.engine_args.session_kv_max_tokens",
         "2048 is more than max_context (1024)"),
        ("max_new_tokens: 1024", "", 6, "stages.0.engine_args.max_new_tokens",
         "leave no room for a prompt in max_context (1024)"),
        ("max_new_tokens: 8, min_new_tokens: 9", "", 6, "stages.0.engine_args.min_new_tokens",
         "9 is more than max_new_tokens (8)"),
        ("session_kv_tokens: 512, session_kv_max_tokens: 1024", "", 6,
         "stages.0.engine_args.session_kv_max_tokens", "session_kv_tokens (512)"),
        ("prefill_batch: 16, prefill_chunk_tokens: 8", "", 6,
         "stages.0.engine_args.prefill_chunk_tokens", "prefill_batch (16)"),
        ("", "max_frames: 2047", 12, "stages.1.engine_args.max_frames",
         "max_context (2048)"),
        ("", "max_frames: 50\n      min_frames: 60", 13, "stages.1.engine_args.min_frames",
         "60 is more than max_frames (50)"),
    ],
)  # fmt: skip
def test_contradicting_limits_are_refused_naming_file_line_and_field(
    tmp_path: Path, thinker: str, talker: str, line: int, field: str, words: str
) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(GRAPH.format(thinker=thinker, talker=talker))
    with pytest.raises(GraphConfigError) as caught:
        load_graph(path)
    error = caught.value
    assert (error.source, error.line, error.field) == (str(path), line, field)
    assert words in str(error)
    assert str(error).startswith(f"{path}:{line}: {field}: ")


def test_a_cascade_reply_budget_as_long_as_its_context_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cascade.yaml"
    path.write_text(
        "name: c\nstages:\n  - name: thinker\n    engine: cascade.thinker\n"
        "    engine_args: {context_tokens: 256, max_new_tokens: 256}\noutputs: [thinker]\n"
    )
    with pytest.raises(GraphConfigError, match=r"cascade.yaml:5: stages.0.engine_args.max_new"):
        load_graph(path)


def test_the_checks_know_the_engines_own_defaults() -> None:
    engines: dict[str, type] = {
        "qwen3_omni.thinker": ThinkerEngine,
        "qwen3_omni.talker": TalkerEngine,
        "cascade.thinker": CascadeThinker,
    }
    for name, cls in engines.items():
        params: dict[str, inspect.Parameter] = {}
        for base in reversed(cls.__mro__):  # the Qwen3-Omni stages' model settings too
            if "__init__" in vars(base):
                params |= dict(inspect.signature(vars(base)["__init__"]).parameters)
        for arg, default in DEFAULTS[name].items():
            assert params[arg].default == default, (name, arg)


def test_an_engine_made_in_code_refuses_them_too() -> None:
    with pytest.raises(ValueError, match="session_kv_max_tokens: 2048 is more than max_context"):
        ThinkerEngine(tiny=True, max_context=1024, session_kv_max_tokens=2048)
    with pytest.raises(ValueError, match="max_frames"):
        TalkerEngine(tiny=True, max_context=512, max_frames=600)


def test_a_thinker_feeding_a_talker_is_held_to_the_talkers_prompt_room(tmp_path: Path) -> None:
    """Left out, `talker_prompt_tokens` is the Talker's room (its max_context less max_frames
    and 10) where that is less than the Thinker's own; more than the room is refused."""
    path = tmp_path / "handoff.yaml"
    path.write_text(GRAPH.format(thinker="max_new_tokens: 24", talker="max_frames: 1500"))
    assert load_graph(path).stage("thinker").engine_args["talker_prompt_tokens"] == 538
    path.write_text(GRAPH.format(thinker="talker_prompt_tokens: 600", talker="max_frames: 1500"))
    with pytest.raises(GraphConfigError) as caught:
        load_graph(path)
    assert (caught.value.line, caught.value.field) == (
        6,
        "stages.0.engine_args.talker_prompt_tokens",
    )
    assert "(538" in str(caught.value) and "stage 'talker'" in str(caught.value)
    roomy = GRAPH.format(thinker="max_new_tokens: 24", talker="max_frames: 50")
    path.write_text(roomy)  # the Talker holds more than the Thinker's 1000
    assert "talker_prompt_tokens" not in load_graph(path).stage("thinker").engine_args
