"""What the Thinker needs of a model server, checked on a real `vllm serve` (vLLM's CPU build
serving SmolLM2-135M-Instruct: loadtest/vllm_server.py) and on the
scripted chat server the failure tests use (tests/fakes/chat_server.py), so the stand-in
keeps the real one's contract: answers stream and end, a named tool's call streams as
arguments that parse, a cancel stops the server generating, sessions stream at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from loadtest.vllm_server import LONG_ANSWER, Vllm
from loadtest.vllm_server import MODEL as VLLM_MODEL
from pipeline.engines.openai_chat.thinker import ChatThinkerEngine
from pipeline.types import End, PipelineRequest, TextDelta, ToolCallDelta, ToolSpec
from tests.fakes.chat_server import MODEL as SCRIPTED_MODEL
from tests.fakes.chat_server import Script, serving

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@dataclass
class Server:
    url: str
    model: str
    running: Callable[[], float]
    held: Callable[[], float]
    """Requests the server holds: generating or waiting for its batch."""


VLLM_START = pytest.mark.timeout(900)
"""The first test to use the server waits for it to start (minutes on a small CPU)."""


@pytest.fixture(params=["scripted", pytest.param("vllm", marks=[pytest.mark.slow, VLLM_START])])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    if request.param == "vllm":
        real: Vllm = request.getfixturevalue("vllm")
        yield Server(real.url, VLLM_MODEL, real.running_requests, real.requests_in)
        return
    async with serving(Script(word_s=0.05, answer=" ".join(["word"] * 60))) as scripted:
        running = lambda: float(scripted.running)  # noqa: E731
        yield Server(scripted.url, SCRIPTED_MODEL, running, running)


@contextlib.asynccontextmanager
async def thinker(server: Server, max_tokens: int = 64) -> AsyncIterator[ChatThinkerEngine]:
    engine = ChatThinkerEngine(
        url=server.url, model=server.model, recognizer="none", max_tokens=max_tokens,
        sampling={"temperature": 0.0}, strict_tools=True,
    )  # fmt: skip
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def turn(text: str, **fields: Any) -> PipelineRequest:
    return PipelineRequest("r", np.zeros(0, np.int16), text=text, **fields)


async def test_an_answer_streams_and_ends_with_its_usage(server: Server) -> None:
    async with thinker(server) as engine:
        chunks = [c async for c in engine.generate("r1", turn("Name a colour."))]
    words = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    assert words.strip() and isinstance(chunks[-1], End)
    assert "Ġ" not in words and "Ċ" not in words  # words, not byte-level BPE pieces
    assert engine.last_usage is not None and engine.last_usage["prompt_tokens"] > 0


async def test_a_named_tools_call_streams_arguments_that_parse(server: Server) -> None:
    request = turn("What is the weather in Paris?", tools=(WEATHER,), tool_choice="get_weather")
    async with thinker(server) as engine:
        chunks = [c async for c in engine.generate("r1", request)]
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert calls and calls[-1].done and {c.name for c in calls} == {"get_weather"}
    arguments = json.loads("".join(c.arguments for c in calls))
    assert isinstance(arguments.get("city"), str)
    assert isinstance(chunks[-1], End)


async def test_a_cancel_stops_the_server_generating(server: Server) -> None:
    long = turn(LONG_ANSWER)
    async with thinker(server) as engine:
        stream = engine.generate("r1", long)
        async for chunk in stream:
            if isinstance(chunk, TextDelta) and chunk.text.strip():
                break
        assert server.running() >= 1
        cancelled = time.monotonic()
        await stream.aclose()  # a barge-in
        async with asyncio.timeout(5):
            while server.running():
                await asyncio.sleep(0.005)
        stopped_ms = (time.monotonic() - cancelled) * 1000
    print(f"the server stopped generating {stopped_ms:.0f} ms after the cancel")
    assert engine.active_requests() == 0


async def test_two_sessions_stream_at_once(server: Server) -> None:
    """Both answers are at the server together (generating, or one waiting for its batch).
    The server is asked how many requests it holds from the start until it has said two
    (then both answers are cancelled: nothing more to learn from them) or both have ended.
    The answers would be long (160 tokens of LONG_ANSWER) so that a busy CPU's slow /metrics
    still sees them: the question asked before was answered in 6 tokens, over before a
    loaded CI machine's first poll came back."""
    answered = 0
    peak = 0.0
    both_held = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while answered < 2 and not both_held.is_set():
            peak = max(peak, await asyncio.to_thread(server.held))
            if peak >= 2:
                both_held.set()
            await asyncio.sleep(0.02)

    async with thinker(server, max_tokens=160) as engine:

        async def one(k: int) -> str:
            nonlocal answered
            text = ""
            stream = engine.generate(f"r{k}", turn(LONG_ANSWER))
            try:
                async for chunk in stream:
                    if isinstance(chunk, TextDelta):
                        text += chunk.text
                    if both_held.is_set() and text.strip():
                        break
            finally:
                await stream.aclose()
                answered += 1
            return text

        watching = asyncio.create_task(watch())
        try:
            answers = await asyncio.gather(one(1), one(2))
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    assert all(a.strip() for a in answers)
    assert peak >= 2  # both at the server together: nothing here serialised them
