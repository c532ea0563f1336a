"""The Qwen3-Omni Thinker's tools: listed in its prompt in Qwen3's format, calls and outputs in
its history, and `<tool_call>` replies read back as ToolCallDelta (the tiny random model
cannot decide anything, so the reading is tested on text)."""

from __future__ import annotations

import json

import numpy as np

from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.tool_calls import CallParser, history_turn
from pipeline.types import End, HistoryItem, PipelineRequest, TextDelta, ToolCallDelta, ToolSpec

WEATHER = ToolSpec("get_weather", "Weather in a city", {"type": "object", "properties": {}})


def parse(pieces: list[str]) -> list[TextDelta | ToolCallDelta]:
    parser = CallParser()
    out = [chunk for piece in pieces for chunk in parser.feed(piece)]
    return out + parser.finish()


def test_a_call_in_small_pieces_becomes_one_done_delta_between_texts() -> None:
    reply = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
    reply += "</tool_call> Done."
    out = parse([reply[i : i + 2] for i in range(0, len(reply), 2)])
    text = "".join(c.text for c in out if isinstance(c, TextDelta))
    calls = [c for c in out if isinstance(c, ToolCallDelta)]
    assert text == "Let me check. Done."
    assert len(calls) == 1 and calls[0].done and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Oslo"}
    assert calls[0].call_id.startswith("call_")


def test_text_that_only_looks_like_a_call_stays_text() -> None:
    assert "".join(c.text for c in parse(["a <b> c <tool", "s"]) if isinstance(c, TextDelta)) == (
        "a <b> c <tools"
    )
    broken = parse(["<tool_call>{not json}</tool_call>"])
    assert broken == [TextDelta(text="<tool_call>{not json}</tool_call>")]
    unclosed = parse(['<tool_call>{"name": "f"'])
    assert unclosed == [TextDelta(text='<tool_call>{"name": "f"')]
    stringly = parse(['<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'])
    assert isinstance(stringly[0], ToolCallDelta) and json.loads(stringly[0].arguments) == {"a": 1}


def test_history_calls_and_outputs_in_qwen_format() -> None:
    call = HistoryItem("assistant", "", kind="function_call", name="f", arguments='{"a": 1}')
    role, text = history_turn(call)
    assert role == "assistant" and text.startswith("<tool_call>\n") and '"name": "f"' in text
    odd = HistoryItem("assistant", "", kind="function_call", name="f", arguments="{oops")
    assert "{oops" in history_turn(odd)[1]
    output = HistoryItem("user", "21 C", kind="function_call_output")
    assert history_turn(output) == ("user", "<tool_response>\n21 C\n</tool_response>")


def test_the_instructions_list_the_offered_tools() -> None:
    engine = ThinkerEngine(tiny=True)
    asked = PipelineRequest("t", np.zeros(0, dtype=np.int16), instructions="Be brief.")
    with_tools = PipelineRequest(
        "t", np.zeros(0, dtype=np.int16), instructions="Be brief.", tools=(WEATHER,)
    )
    assert engine._instructions(asked) == "Be brief."  # noqa: SLF001
    listed = engine._instructions(with_tools)  # noqa: SLF001
    assert listed.startswith("Be brief.") and '"name": "get_weather"' in listed
    none = PipelineRequest(
        "t", np.zeros(0, dtype=np.int16), instructions="Be brief.", tools=(WEATHER,),
        tool_choice="none",
    )  # fmt: skip
    assert engine._instructions(none) == "Be brief."  # noqa: SLF001


async def test_a_turn_with_tools_and_a_call_in_its_history_runs() -> None:
    engine = ThinkerEngine(tiny=True, max_new_tokens=4, min_new_tokens=4)
    await engine.start()
    try:
        history = (
            HistoryItem("user", "Weather?"),
            HistoryItem("assistant", "", kind="function_call", name="get_weather", call_id="c"),
            HistoryItem("user", "sunny", kind="function_call_output", call_id="c"),
        )
        request = PipelineRequest(
            "t", np.zeros(0, dtype=np.int16), text="And now?", history=history, tools=(WEATHER,)
        )
        out = [c async for c in engine.generate("t", request)]
        assert isinstance(out[-1], End)
        assert sum(isinstance(c, TextDelta) for c in out) == 4
        assert engine.active_requests() == 0
    finally:
        await engine.close()
