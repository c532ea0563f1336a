"""`parley serve` with its Thinker on a model server (the shipped `vllm` graph, pointed at the
scripted chat server): the official SDK's Realtime WebSocket holds a spoken turn, a tool
call, and a turn the server fails (the response fails with the reason, the next works);
`/readyz` names the model server while it is down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from tests.fakes.chat_server import ANSWER, MODEL, ChatServer, Script, serving
from tests.realtime.apps import ServedApp, served_app
from web.settings import Settings

from .realtime_turns import WEATHER, graph_for, say, until

KEY = "sk-test-parley-chat"


def chat_graph(url: str, directory: Path) -> str:
    return graph_for(directory, url=url, model=MODEL, probe_s=0.2, stall_timeout_s=2)


@pytest.fixture
async def chat() -> AsyncIterator[ChatServer]:
    async with serving() as served:
        yield served


@pytest.fixture
async def parley(chat: ChatServer, tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    settings = Settings(pipeline=chat_graph(chat.url, tmp_path), api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as served:
        yield served


@pytest.mark.slow
async def test_a_spoken_turn_a_tool_call_and_a_failed_turn(
    chat: ChatServer, parley: ServedApp
) -> None:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{parley.http_url}/v1") as client,
        client.realtime.connect(model="parley") as conn,
    ):
        await until(conn, "session.created")
        await say(conn, "What is the capital of France?")
        done = await until(conn, "response.done")
        assert done.response.status == "completed"
        said = done.response.output[0].content[0].transcript
        assert said.strip() == ANSWER
        heard = chat.requests[-1]["messages"][-1]["content"].lower()
        assert "capital" in heard and "france" in heard  # Whisper heard it, the server got it

        await conn.session.update(session={"type": "realtime", "tools": [WEATHER]})  # type: ignore[list-item]
        await say(conn, "What is the weather in Paris?")
        done = await until(conn, "response.done")
        call = done.response.output[-1]
        assert call.type == "function_call" and call.name == "get_weather"
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}
        )
        await conn.response.create()
        done = await until(conn, "response.done")
        assert done.response.status == "completed"
        assert chat.requests[-1]["messages"][-1]["role"] == "tool"

        chat.script = Script(mode="status", status=503)
        await conn.response.create()
        done = await until(conn, "response.done")
        assert done.response.status == "failed"
        assert "503" in str(done.response.status_details)
        chat.script = Script()
        await conn.response.create()
        done = await until(conn, "response.done")
        assert done.response.status == "completed"


async def test_readyz_names_the_model_server_while_it_is_down(
    tmp_path: Path, redis_url: str
) -> None:
    async with serving() as gone:
        url = gone.url
    settings = Settings(pipeline=chat_graph(url, tmp_path), api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as served, httpx.AsyncClient() as http:
        async with asyncio.timeout(30):
            while True:
                ready = await http.get(f"{served.http_url}/readyz")
                if ready.status_code == 503 and "thinker" in ready.json().get("down_stages", {}):
                    break
                await asyncio.sleep(0.2)
        assert url in ready.json()["down_stages"]["thinker"]
        assert (await http.get(f"{served.http_url}/healthz")).status_code == 200
