"""Tool prompts, the call grammar's schema bounds, and reading a call's text into deltas."""

from __future__ import annotations

import json

import pytest

from pipeline.engines.cascade.tool_prompt import (
    MAX_STRING,
    arguments_schema,
    call_grammar,
    call_text,
    history_messages,
    plain_words,
)
from pipeline.engines.cascade.tool_stream import CallCutOff, CallReader
from pipeline.types import HistoryItem, ToolCallDelta, ToolSpec


def test_a_call_read_in_small_pieces_streams_its_arguments() -> None:
    text = call_text("get_weather", '{"city": "Paris", "days": [1, 2]}')
    reader = CallReader()
    deltas: list[ToolCallDelta] = []
    for i in range(0, len(text), 3):
        deltas += reader.feed(text[i : i + 3])
    deltas.append(reader.finish())
    assert len(deltas) > 3 and deltas[-1].done and not any(d.done for d in deltas[:-1])
    assert {d.name for d in deltas} == {"get_weather"}
    assert json.loads("".join(d.arguments for d in deltas)) == {"city": "Paris", "days": [1, 2]}


def test_a_call_cut_off_by_the_budget_is_an_error() -> None:
    reader = CallReader()
    reader.feed(call_text("f", '{"a": "b"}')[:-5])
    with pytest.raises(CallCutOff):
        reader.finish()


def test_only_the_call_marker_starts_a_call() -> None:
    assert CallReader.starts_call("<tool") and CallReader.starts_call("<tool_call>{")
    assert not CallReader.starts_call("Sure") and not CallReader.starts_call("")


def test_history_renders_calls_and_outputs_in_order() -> None:
    items = (
        HistoryItem("user", "Weather?"),
        HistoryItem("assistant", "", kind="function_call", name="w", call_id="c", arguments="{}"),
        HistoryItem("user", '{"t": 21, "sky": "sunny"}', kind="function_call_output", call_id="c"),
        HistoryItem("system", "ignored here"),
    )
    messages = history_messages(items)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == call_text("w", "{}")
    assert "w" in messages[2]["content"] and "t is 21, sky is sunny" in messages[2]["content"]
    assert plain_words("not json") == "not json"


def test_schemas_get_bounds_and_an_empty_tool_takes_no_arguments() -> None:
    schema = arguments_schema(
        ToolSpec("f", parameters={"type": "object", "properties": {
            "s": {"type": "string"}, "e": {"type": "string", "enum": ["a"]},
            "l": {"type": "array", "items": {"type": "string"}},
        }})
    )  # fmt: skip
    assert schema["properties"]["s"]["maxLength"] == MAX_STRING
    assert "maxLength" not in schema["properties"]["e"]
    assert schema["properties"]["l"]["maxItems"] > 0
    assert schema["properties"]["l"]["items"]["maxLength"] == MAX_STRING
    assert arguments_schema(ToolSpec("g")) == {
        "type": "object", "properties": {}, "additionalProperties": False,
    }  # fmt: skip
    grammar = call_grammar([ToolSpec("g"), ToolSpec("h")])
    assert '"<tool_call>"' in grammar and "%json" in grammar and "call_1" in grammar
