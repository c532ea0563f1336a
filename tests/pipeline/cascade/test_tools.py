"""The Thinker calls tools (real SmolLM2, CPU): decided or forced, arguments always valid, and
the turn after the tool's output answers with it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import jsonschema  # type: ignore[import-untyped]
import numpy as np
import pytest

from pipeline.engines.cascade.smollm import LanguageModel
from pipeline.engines.cascade.thinker import NOT_HEARD, ThinkerEngine
from pipeline.types import (
    Chunk,
    End,
    ErrorChunk,
    HistoryItem,
    PipelineRequest,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
)
from tests.pipeline.cascade.conftest import Speak

WEATHER = ToolSpec(
    "get_weather",
    "Get the current weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
ALARM = ToolSpec(
    "set_alarm",
    "Set an alarm",
    {
        "type": "object",
        "properties": {
            "hour": {"type": "integer"},
            "minute": {"type": "integer"},
            "days": {"type": "array", "items": {"enum": ["mon", "tue", "wed", "sat", "sun"]}},
            "loud": {"type": "boolean"},
            "volume": {"type": "number"},
            "sound": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
        "required": ["hour", "minute", "days", "loud", "sound"],
        "additionalProperties": False,
    },
)


def typed(text: str | None, **kwargs: object) -> PipelineRequest:
    return PipelineRequest("t", np.zeros(0, dtype=np.int16), text=text, **kwargs)  # type: ignore[arg-type]


def spoken(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta) and c.kind == "output")


def the_call(chunks: list[Chunk], tool: ToolSpec) -> dict[str, object]:
    """The one call of a turn: its deltas are well formed, and its arguments validate."""
    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert deltas and [d.done for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert {d.name for d in deltas} == {tool.name}
    assert len({d.call_id for d in deltas}) == 1 and deltas[0].call_id.startswith("call_")
    assert isinstance(chunks[-1], End) and not spoken(chunks)
    arguments = json.loads("".join(d.arguments for d in deltas))
    jsonschema.validate(arguments, tool.parameters)
    assert isinstance(arguments, dict)
    return arguments


@pytest.fixture
async def thinker(language_model: LanguageModel) -> AsyncIterator[ThinkerEngine]:
    engine = ThinkerEngine(max_new_tokens=24, batch_window_ms=50)
    await engine.start()
    yield engine
    await engine.close()


async def ask(thinker: ThinkerEngine, request: PipelineRequest, rid: str = "t") -> list[Chunk]:
    return [c async for c in thinker.generate(rid, request)]


async def test_a_weather_question_calls_the_weather_tool(thinker: ThinkerEngine) -> None:
    chunks = await ask(thinker, typed("What is the weather in Paris?", tools=(WEATHER,)))
    arguments = the_call(chunks, WEATHER)
    assert "paris" in str(arguments["city"]).lower()
    assert thinker.active_requests() == 0


async def test_required_gives_valid_arguments_even_for_an_unrelated_question(
    thinker: ThinkerEngine,
) -> None:
    request = typed("Who wrote Hamlet?", tools=(WEATHER, ALARM), tool_choice="required")
    chunks = await ask(thinker, request)
    name = next(c.name for c in chunks if isinstance(c, ToolCallDelta))
    the_call(chunks, WEATHER if name == WEATHER.name else ALARM)


async def test_a_named_tool_choice_forces_that_tool_and_its_whole_schema(
    thinker: ThinkerEngine,
) -> None:
    request = typed("Wake me at seven.", tools=(WEATHER, ALARM), tool_choice="set_alarm")
    arguments = the_call(await ask(thinker, request), ALARM)
    assert set(arguments) >= {"hour", "minute", "days", "loud", "sound"}


async def test_tool_choice_none_answers_in_words(thinker: ThinkerEngine) -> None:
    request = typed("What is the weather in Paris?", tools=(WEATHER,), tool_choice="none")
    chunks = await ask(thinker, request)
    assert spoken(chunks).strip() and isinstance(chunks[-1], End)
    assert not any(isinstance(c, ToolCallDelta) for c in chunks)


async def test_an_unknown_tool_name_is_an_error(thinker: ThinkerEngine) -> None:
    chunks = await ask(thinker, typed("Hi", tools=(WEATHER,), tool_choice="get_time"))
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)


@pytest.mark.parametrize(
    ("instructions", "output"),
    [
        ("", '{"temperature_c": 21, "sky": "sunny"}'),
        # the Agents SDK's test: SmolLM2 once "answered" by copying the call as text
        ("You are a helpful assistant. Answer in one short sentence.",
         "It is sunny and 21 degrees in Paris."),
    ],
)  # fmt: skip
async def test_the_answer_after_the_output_uses_it(
    thinker: ThinkerEngine, instructions: str, output: str
) -> None:
    history = (
        HistoryItem("user", "What is the weather in Paris?"),
        HistoryItem(
            "assistant", "", kind="function_call", name="get_weather", call_id="call_1",
            arguments='{"city": "Paris"}',
        ),
        HistoryItem("user", output, kind="function_call_output", call_id="call_1"),
    )  # fmt: skip
    request = typed(None, history=history, tools=(WEATHER,), instructions=instructions)
    chunks = await ask(thinker, request)
    answer = spoken(chunks)
    assert "21" in answer or "sunny" in answer.lower(), answer
    assert "<" not in answer and isinstance(chunks[-1], End)


async def test_instructions_alone_are_answered(thinker: ThinkerEngine) -> None:
    chunks = await ask(thinker, typed(None, instructions="Greet the user warmly."))
    assert spoken(chunks).strip() and NOT_HEARD not in spoken(chunks)
    assert spoken(chunks).strip() != "Greet the user warmly."


async def test_a_silent_spoken_turn_is_not_heard(thinker: ThinkerEngine) -> None:
    silence = PipelineRequest("t", np.zeros(8000, dtype=np.int16), instructions="Greet me.")
    assert await ask(thinker, silence) == [TextDelta(text=NOT_HEARD), End()]


async def test_a_transcribe_only_turn_ends_after_its_transcript(
    thinker: ThinkerEngine, speak: Speak
) -> None:
    request = PipelineRequest("t", speak("hello there"), transcribe_only=True)
    chunks = await ask(thinker, request)
    assert isinstance(chunks[-1], End)
    assert all(isinstance(c, TextDelta) and c.kind == "input_transcript" for c in chunks[:-1])


async def test_max_output_tokens_caps_the_reply(thinker: ThinkerEngine) -> None:
    chunks = await ask(thinker, typed("Tell me a long story.", max_output_tokens=5))
    assert thinker._lm is not None  # noqa: SLF001
    tokens = thinker._lm.tokenizer(spoken(chunks), add_special_tokens=False).input_ids  # noqa: SLF001
    assert 0 < len(tokens) <= 6  # 5 generated tokens, re-tokenized
    auto = await ask(thinker, typed("Tell me a long story.", tools=(WEATHER,), max_output_tokens=5))
    assert not any(isinstance(c, ToolCallDelta) for c in auto)
    assert 0 < len(thinker._lm.tokenizer(spoken(auto)).input_ids) <= 6  # noqa: SLF001


async def test_a_call_and_a_reply_share_a_batch(thinker: ThinkerEngine) -> None:
    call, reply = await asyncio.gather(
        ask(thinker, typed("Weather in Rome?", tools=(WEATHER,), tool_choice="required"), "a"),
        ask(thinker, typed("Name a red fruit."), "b"),
    )
    assert thinker.batch_size == 2
    assert "rome" in str(the_call(call, WEATHER)["city"]).lower()
    assert spoken(reply).strip() and isinstance(reply[-1], End)
    assert thinker.active_requests() == 0
