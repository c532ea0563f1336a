"""The Thinker on an OpenAI-compatible server (pipeline/engines/openai_chat/), against the
scripted chat server (tests/fakes/chat_server.py) for what a real one will not do on
demand: every failure ends the answer with words, a cancel aborts the server's request,
many sessions stream at once, the probe says when the server is down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from pipeline.engines.openai_chat.chat_messages import chat_messages
from pipeline.engines.openai_chat.chat_stream import ChatDeltas
from pipeline.engines.openai_chat.thinker import ChatThinkerEngine
from pipeline.types import (
    End,
    ErrorChunk,
    HistoryItem,
    PipelineRequest,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
)
from tests.fakes.chat_server import ANSWER, MODEL, ChatServer, Script, serving

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
async def server() -> AsyncIterator[ChatServer]:
    async with serving() as served:
        yield served


@contextlib.asynccontextmanager
async def thinker(url: str, **options: Any) -> AsyncIterator[ChatThinkerEngine]:
    engine = ChatThinkerEngine(url=url, model=MODEL, recognizer="none", probe_s=0.2, **options)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()
        await engine.close()  # idempotent


async def answer(engine: ChatThinkerEngine, request: PipelineRequest, rid: str = "r1") -> list[Any]:
    return [chunk async for chunk in engine.generate(rid, request)]


def text_of(chunks: list[Any]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta) and c.kind == "output")


async def test_an_answer_streams_as_text_then_ends(server: ChatServer) -> None:
    async with thinker(server.url) as engine:
        chunks = await answer(engine, PipelineRequest("r1", np.zeros(0, np.int16), text="Hi"))
    assert text_of(chunks) == ANSWER and isinstance(chunks[-1], End)
    sent = server.requests[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["messages"][-1] == {"role": "user", "content": "Hi"}
    assert engine.last_usage is not None and engine.last_usage["prompt_tokens"] == 10


async def test_a_tool_call_streams_as_call_deltas_and_its_output_goes_back(
    server: ChatServer,
) -> None:
    request = PipelineRequest(
        "r1", np.zeros(0, np.int16), text="Weather in Paris?", tools=(WEATHER,)
    )
    async with thinker(server.url) as engine:
        chunks = await answer(engine, request)
        calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
        assert calls[-1].done and all(c.call_id == "call_fake1" for c in calls)
        assert "".join(c.arguments for c in calls) == '{"city": "fake"}'
        history = (
            HistoryItem("user", "Weather in Paris?"),
            HistoryItem(
                "assistant",
                "",
                kind="function_call",
                name="get_weather",
                call_id="call_fake1",
                arguments='{"city": "fake"}',
            ),  # fmt: skip
            HistoryItem("user", "18 C", kind="function_call_output", call_id="call_fake1"),
        )
        again = PipelineRequest("r2", np.zeros(0, np.int16), history=history, tools=(WEATHER,))
        chunks = await answer(engine, again, "r2")
    messages = server.requests[-1]["messages"]
    assert messages[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_fake1", "content": "18 C"}
    assert text_of(chunks) == ANSWER


@pytest.mark.parametrize(
    ("script", "words"),
    [
        (Script(mode="status", status=503), "503 Service Unavailable: the model is overloaded"),
        (Script(mode="stall"), "sent nothing for 0.5 s"),
        (Script(mode="malformed"), "not JSON"),
        (Script(mode="error_event"), "the engine died"),
        (Script(mode="die"), "model server"),
    ],
)
async def test_a_failure_ends_the_answer_with_its_reason(
    server: ChatServer, script: Script, words: str
) -> None:
    server.script = script
    async with thinker(server.url, stall_timeout_s=0.5) as engine:
        async with asyncio.timeout(10):
            chunks = await answer(engine, PipelineRequest("r1", np.zeros(0, np.int16), text="Hi"))
        assert isinstance(chunks[-1], ErrorChunk) and words in chunks[-1].message, chunks[-1]
        server.script = Script()  # the server is well again: so is the next turn
        engine.stall_timeout_s = 30.0  # (0.5 s made a loaded CI machine's healthy turn a stall)
        chunks = await answer(engine, PipelineRequest("r2", np.zeros(0, np.int16), text="Hi"), "r2")
        assert text_of(chunks) == ANSWER, chunks
        assert engine.active_requests() == 0


async def test_a_server_that_is_gone_is_a_reason_and_the_probe_says_so() -> None:
    async with serving() as gone:
        url = gone.url
    async with thinker(url) as engine:
        chunks = await answer(engine, PipelineRequest("r1", np.zeros(0, np.int16), text="Hi"))
        assert isinstance(chunks[-1], ErrorChunk) and "cannot be reached" in chunks[-1].message
        async with asyncio.timeout(5):
            while engine.stalled(1.0) is None:
                await asyncio.sleep(0.05)
        assert url in (engine.stalled(1.0) or "")


async def test_a_cancel_aborts_the_servers_request_at_once(server: ChatServer) -> None:
    server.script = Script(word_s=0.05, answer=" ".join(["word"] * 200))
    async with thinker(server.url) as engine:
        stream = engine.generate("r1", PipelineRequest("r1", np.zeros(0, np.int16), text="Hi"))
        async for chunk in stream:
            if isinstance(chunk, TextDelta) and server.running:
                break
        await stream.aclose()  # a barge-in
        await engine.abort("r1")
        async with asyncio.timeout(2):  # the server's next word finds the client gone
            while server.running:
                await asyncio.sleep(0.01)
        assert engine.active_requests() == 0


async def test_many_sessions_stream_at_once(server: ChatServer) -> None:
    server.script = Script(word_s=0.05)
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, server.running)
            await asyncio.sleep(0.01)

    async with thinker(server.url) as engine:
        watcher = asyncio.create_task(watch())
        try:
            answers = await asyncio.gather(
                *(
                    answer(
                        engine, PipelineRequest(f"r{k}", np.zeros(0, np.int16), text="Hi"), f"r{k}"
                    )
                    for k in range(8)
                )
            )
        finally:
            watcher.cancel()
    assert all(text_of(a) == ANSWER for a in answers)
    assert peak == 8  # none waited for another


def test_a_sessions_request_begins_as_its_last_one_did() -> None:
    """The server's prefix cache hits only on the same bytes: turn 2's messages begin with
    turn 1's, the answer and the new turn after them."""
    first = PipelineRequest("r1", np.zeros(0, np.int16), text="Hello", instructions="Be brief.")
    turn_1 = chat_messages(first, "Hello")
    history = (HistoryItem("user", "Hello"), HistoryItem("assistant", "Hi there."))
    second = PipelineRequest("r2", np.zeros(0, np.int16), history=history, instructions="Be brief.")
    turn_2 = chat_messages(second, "And now?")
    assert turn_2[: len(turn_1)] == turn_1
    assert turn_2[len(turn_1) :] == [
        {"role": "assistant", "content": "Hi there."},
        {"role": "user", "content": "And now?"},
    ]


def test_two_calls_in_one_answer_are_one_after_the_other() -> None:
    deltas = ChatDeltas()
    out: list[Any] = []
    for piece in (
        {"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x":'}},
        {"index": 0, "function": {"arguments": "1}"}},
        {"index": 1, "id": "b", "function": {"name": "g"}},
    ):
        out += deltas.feed({"choices": [{"delta": {"tool_calls": [piece]}}]})
    out += deltas.finish()
    assert [(c.call_id, c.arguments, c.done) for c in out] == [
        ("a", '{"x":', False),
        ("a", "1}", False),
        ("a", "", True),
        ("b", "{}", True),  # no arguments: an empty object
    ]


async def test_a_server_whose_answers_stall_is_down_until_it_answers_again(
    server: ChatServer,
) -> None:
    """It still lists its models, so only its answers tell: the stall marks it down (for
    /readyz), and the probe's one-token answer clears it once it generates again."""
    server.script = Script(mode="stall")
    async with thinker(server.url, stall_timeout_s=0.5) as engine:
        chunks = await answer(engine, PipelineRequest("r1", np.zeros(0, np.int16), text="Hi"))
        assert isinstance(chunks[-1], ErrorChunk)
        reason = engine.stalled(1.0)
        assert reason is not None and "stall" in reason and server.url in reason
        await asyncio.sleep(1.5)  # the probe's own answers stall too: still down
        assert engine.stalled(1.0) is not None
        server.script = Script()
        async with asyncio.timeout(5):
            while engine.stalled(1.0) is not None:
                await asyncio.sleep(0.05)
