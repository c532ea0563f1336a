"""`parley serve --pipeline <the vllm graph>` against a real `vllm serve` (vLLM's CPU build,
SmolLM2-135M-Instruct): the official SDK's Realtime WebSocket holds a spoken turn answered
by vLLM, a tool call, a barge-in that aborts vLLM's request (its own metrics say so), and a
server stuck mid-answer (the response fails with the reason, the next works once it
moves again), and a server killed mid-answer (the response fails with the reason, /readyz
says the model server is down, and the next turn works once it serves again)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from loadtest.vllm_server import MODEL, Vllm, restart, shared_memory_of
from tests.realtime.apps import ServedApp, served_app
from web.settings import Settings

from .realtime_turns import WEATHER, graph_for, say, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the server may start first

KEY = "sk-test-parley-vllm"


@pytest.fixture
async def parley(vllm: Vllm, tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = graph_for(
        tmp_path,
        url=vllm.url,
        model=MODEL,
        stall_timeout_s=3,
        probe_s=1,
        sampling={"temperature": 0.0},  # greedy: short answers, the same on every run
    )
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as served:
        yield served


async def test_a_spoken_turn_a_tool_call_a_barge_in_and_a_stuck_server(
    vllm: Vllm, parley: ServedApp
) -> None:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{parley.http_url}/v1") as client,
        client.realtime.connect(model="parley") as conn,
    ):
        await until(conn, "session.created")
        # the answers play out in real time: short ones keep the test short
        await conn.session.update(
            session={"type": "realtime", "instructions": "Answer in one short sentence."}
        )
        await say(conn, "What is the capital of France?")
        done = await until(conn, "response.done")
        assert done.response.status == "completed", done.response.status_details
        assert done.response.output[0].content[0].transcript.strip()

        session = {"type": "realtime", "tools": [WEATHER],
                   "tool_choice": {"type": "function", "name": "get_weather"}}  # fmt: skip
        await conn.session.update(session=session)  # type: ignore[arg-type]
        await say(conn, "What is the weather in Paris?")
        done = await until(conn, "response.done")
        call = done.response.output[-1]
        assert call.type == "function_call" and call.name == "get_weather"
        await conn.session.update(session={"type": "realtime", "tool_choice": "none"})
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}
        )
        await conn.response.create()
        done = await until(conn, "response.done")
        assert done.response.status == "completed", done.response.status_details

        await conn.response.create(
            response={"instructions": "Count slowly from one to one hundred."}
        )
        await until(conn, "response.output_audio_transcript.delta")
        assert vllm.running_requests() >= 1
        cancelled = time.monotonic()
        await conn.response.cancel()
        async with asyncio.timeout(5):
            while vllm.running_requests():
                await asyncio.sleep(0.01)
        print(f"vLLM stopped {1000 * (time.monotonic() - cancelled):.0f} ms after the cancel")
        await until(conn, "response.done")

        await conn.response.create()
        await until(conn, "response.created")
        vllm.pause()  # stuck mid-answer
        try:
            done = await until(conn, "response.done", within_s=30)
        finally:
            vllm.resume()
        assert done.response.status == "failed"
        assert "sent nothing for 3 s" in str(done.response.status_details)
        async with asyncio.timeout(30):  # vLLM, moving again, drops the abandoned request
            while vllm.running_requests():
                await asyncio.sleep(0.05)
        for _ in range(3):  # on a loaded machine a first token can take past the 3 s bound
            await conn.response.create()
            done = await until(conn, "response.done")
            if done.response.status == "completed":
                break
        assert done.response.status == "completed", done.response.status_details


async def test_a_server_killed_mid_answer_fails_the_answer_and_serves_again(
    vllm: Vllm, parley: ServedApp
) -> None:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{parley.http_url}/v1") as client,
        client.realtime.connect(model="parley") as conn,
        httpx.AsyncClient(base_url=parley.http_url) as http,
    ):
        await until(conn, "session.created")
        await conn.session.update(
            session={"type": "realtime", "instructions": "Answer in one short sentence."}
        )
        mapped = shared_memory_of(vllm.process.pid)
        assert mapped  # vLLM's message queues
        await conn.response.create(
            response={"instructions": "Count slowly from one to one hundred."}
        )
        await until(conn, "response.output_audio_transcript.delta")
        vllm.kill()
        assert not [path for path in mapped if path.exists()]  # none left in /dev/shm
        try:
            done = await until(conn, "response.done", within_s=30)
            assert done.response.status == "failed"
            assert "closed the connection mid-answer" in str(done.response.status_details)
            async with asyncio.timeout(10):
                while (await http.get("/readyz")).status_code != 503:
                    await asyncio.sleep(0.2)
            down = (await http.get("/readyz")).json()["down_stages"]
            assert "cannot be reached" in down["thinker"], down
            assert (await http.get("/healthz")).status_code == 200
        finally:
            await asyncio.to_thread(restart, vllm)  # the same port: Parley's URL holds
        async with asyncio.timeout(10):
            while (await http.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.2)
        await conn.response.create()
        done = await until(conn, "response.done")
        assert done.response.status == "completed", done.response.status_details
