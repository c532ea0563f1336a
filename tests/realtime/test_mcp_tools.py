"""Remote MCP tools (`{"type": "mcp"}` in session.tools) end to end: a real MCP server on
loopback (the `mcp` SDK's MCPServer, streamable HTTP, in a child process), a real uvicorn
serving the embedded cascade (SmolLM2 calls the tool), and the official `openai` SDK's
realtime client. Every event the server sends parses as a type the SDK declares."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from loadtest.speech import silence, speak, trim_silence
from sessions.mcp_client import McpError, call_tool
from sessions.mcp_config import McpToolConfig
from tests.conftest import fail_on_tasks_left
from tests.frameworks.conftest import sessions_ended

from .apps import ServedApp, served_cascade
from .mcp_weather_server import FORECAST

KEY = "sk-test-parley-mcp"
DB = 7
"""The cascade server's database on the test redis-server (the tests' own is 0)."""
LOOP = pytest.mark.asyncio(loop_scope="module")
SERVER_SCRIPT = Path(__file__).with_name("mcp_weather_server.py")
QUESTION = "What is the weather in Paris?"
EVENTS: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
ONE = ["get_weather"]
"""Most tests offer one tool: a cold Thinker compiling three tools' grammars at its first
request can pass its 5 s hang bound on 2 cores (the model tests warm it; these may not)."""

pytestmark = [LOOP, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    """The MCP server, started once for the module, stopped (and reaped) after it."""
    port = _free_port()
    child = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
                break
            if child.poll() is not None:
                raise RuntimeError("the MCP server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        child.terminate()
        child.wait(10)


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _no_leaked_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    await fail_on_tasks_left(before)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cascade(redis_socket: str) -> AsyncIterator[ServedApp]:
    async with served_cascade(redis_socket, DB, KEY, "the MCP tests' server") as app:
        yield app


@pytest_asyncio.fixture(loop_scope="module")
async def server(cascade: ServedApp) -> AsyncIterator[ServedApp]:
    await sessions_ended(cascade)
    yield cascade
    await sessions_ended(cascade)


def mcp_tool(url: str, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "weather", "server_url": url, **fields}


class Conn:
    """The SDK's connection, keeping every event (each checked against the SDK's union)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.events: list[Any] = []

    async def until(self, kind: str, within_s: float = 60) -> Any:
        async with asyncio.timeout(within_s):
            while True:  # strict: the JSON as sent must be one of the SDK's event types
                event = EVENTS.validate_json(await self.conn.recv_bytes())
                self.events.append(event)
                if event.type == kind:
                    return event

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    async def ask(self, text: str, **response: Any) -> Any:
        await self.conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            }
        )
        await self.conn.response.create(response=response)
        return await self.until("response.done", within_s=120)


@contextlib.asynccontextmanager
async def session(
    server: ServedApp, tools: list[dict[str, Any]], modality: Literal["text", "audio"] = "text"
) -> AsyncIterator[Conn]:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.realtime.connect(model="parley") as raw,
    ):
        conn = Conn(raw)
        await conn.until("session.created")
        await raw.session.update(
            session={"type": "realtime", "output_modalities": [modality], "tools": tools}  # type: ignore[typeddict-item]
        )
        await conn.until("session.updated")
        yield conn


def forced(name: str = "get_weather") -> dict[str, Any]:
    return {"tool_choice": {"type": "mcp", "server_label": "weather", "name": name}}


def answer_text(done: Any) -> str:
    return " ".join(
        part.text or part.transcript or ""
        for item in done.response.output
        if item.type == "message"
        for part in item.content
    )


async def test_listing_then_a_call_whose_result_the_model_speaks(
    server: ServedApp, mcp_url: str
) -> None:
    tools = [mcp_tool(mcp_url, allowed_tools=["get_weather"], require_approval="never")]
    async with session(server, tools) as conn:
        await conn.until("mcp_list_tools.completed")
        assert conn.of("mcp_list_tools.in_progress")
        listing = [
            e.item for e in conn.of("conversation.item.added") if e.item.type == "mcp_list_tools"
        ]
        assert [t.name for t in listing[0].tools] == ["get_weather"]  # allowed_tools filters
        session_tools = conn.of("session.updated")[-1].session.tools
        assert session_tools[0].type == "mcp" and session_tools[0].server_label == "weather"

        done = await conn.ask(QUESTION, **forced())
        kinds = [e.type for e in conn.events]
        for kind in (
            "response.mcp_call_arguments.delta",
            "response.mcp_call_arguments.done",
            "response.mcp_call.in_progress",
            "response.mcp_call.completed",
        ):
            assert kind in kinds, kind
        added = [e.item for e in conn.of("response.output_item.added") if e.item.type == "mcp_call"]
        assert added and added[0].server_label == "weather" and added[0].name == "get_weather"
        call = next(i for i in done.response.output if i.type == "mcp_call")
        assert FORECAST in (call.output or ""), call
        assert "paris" in call.arguments.lower()
        assert done.response.status == "completed"
        text = answer_text(done)
        assert "21" in text or "sunny" in text.lower(), text


async def test_approval_asked_then_approved_runs_and_is_spoken(
    server: ServedApp, mcp_url: str
) -> None:
    async with session(
        server, [mcp_tool(mcp_url, allowed_tools=ONE, require_approval="always")]
    ) as conn:
        await conn.until("mcp_list_tools.completed")
        done = await conn.ask(QUESTION, **forced())
        request = next(i for i in done.response.output if i.type == "mcp_approval_request")
        assert request.name == "get_weather" and not conn.of("response.mcp_call.in_progress")
        await conn.conn.conversation.item.create(
            item={
                "type": "mcp_approval_response",
                "approval_request_id": request.id,
                "approve": True,
            }
        )
        await conn.conn.response.create()
        done = await conn.until("response.done", within_s=120)
        call = next(i for i in done.response.output if i.type == "mcp_call")
        assert call.approval_request_id == request.id and FORECAST in (call.output or "")
        text = answer_text(done)
        assert "21" in text or "sunny" in text.lower(), text


async def test_approval_denied_is_not_called(server: ServedApp, mcp_url: str) -> None:
    async with session(
        server, [mcp_tool(mcp_url, allowed_tools=ONE)]
    ) as conn:  # OpenAI's default: always
        await conn.until("mcp_list_tools.completed")
        done = await conn.ask(QUESTION, **forced())
        request = next(i for i in done.response.output if i.type == "mcp_approval_request")
        await conn.conn.conversation.item.create(
            item={
                "type": "mcp_approval_response",
                "approval_request_id": request.id,
                "approve": False,
            }
        )
        await conn.conn.response.create()
        done = await conn.until("response.done", within_s=120)
        assert done.response.status == "completed"
        assert not conn.of("response.mcp_call.in_progress")
        assert all(i.type != "mcp_call" for i in done.response.output)
        assert answer_text(done).strip()


async def test_a_server_that_is_down_fails_the_listing_and_the_session_goes_on(
    server: ServedApp,
) -> None:
    down = f"http://127.0.0.1:{_free_port()}/mcp"
    async with session(server, [mcp_tool(down, require_approval="never")]) as conn:
        await conn.until("mcp_list_tools.failed")
        error = await conn.until("error")
        assert error.error.code == "mcp_list_tools_failed" and "weather" in error.error.message
        done = await conn.ask("Say hello.")
        assert done.response.status == "completed" and answer_text(done).strip()


async def test_a_tool_that_raises_fails_the_call_and_the_conversation_goes_on(
    server: ServedApp, mcp_url: str
) -> None:
    async with session(
        server, [mcp_tool(mcp_url, allowed_tools=["broken_weather"], require_approval="never")]
    ) as conn:
        await conn.until("mcp_list_tools.completed")
        done = await conn.ask(QUESTION, **forced("broken_weather"))
        assert conn.of("response.mcp_call.failed")
        call = next(i for i in done.response.output if i.type == "mcp_call")
        assert call.error is not None and call.error.type == "tool_execution_error"
        assert call.output is None
        assert done.response.status == "completed" and answer_text(done).strip()
        done = await conn.ask("Thank you.")
        assert done.response.status == "completed"


async def test_a_cancel_during_a_call_cancels_it(server: ServedApp, mcp_url: str) -> None:
    async with session(
        server, [mcp_tool(mcp_url, allowed_tools=["slow_weather"], require_approval="never")]
    ) as conn:
        await conn.until("mcp_list_tools.completed")
        await conn.conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": QUESTION}],
            }
        )
        await conn.conn.response.create(response=forced("slow_weather"))
        await conn.until("response.mcp_call.in_progress", within_s=60)
        await conn.conn.response.cancel()
        done = await conn.until("response.done", within_s=10)
        assert done.response.status == "cancelled"
        call = next(i for i in done.response.output if i.type == "mcp_call")
        assert call.output is None and not conn.of("response.mcp_call.completed")
        assert getattr(call, "status", None) == "incomplete"
        done = await conn.ask("Say hello.")
        assert done.response.status == "completed"


async def test_a_call_past_its_deadline_fails_with_the_reason(mcp_url: str) -> None:
    config = McpToolConfig(server_label="weather", server_url=mcp_url)
    with pytest.raises(McpError) as caught:
        await call_tool(config, "slow_weather", '{"city": "Paris"}', deadline_s=0.5)
    assert caught.value.wire() == {
        "type": "http_error",
        "code": 504,
        "message": "the MCP server did not answer within 0.5 s",
    }


async def test_a_session_that_ends_while_a_listing_waits_leaves_nothing_behind(
    server: ServedApp,
) -> None:
    """A server that takes the connection and never answers: the session's end cancels the
    listing (the autouse fixture fails on any task left, the module's on any Redis key)."""
    connected = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set()
        while await reader.read(4096):  # until the client goes away
            pass
        writer.close()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        async with session(server, [mcp_tool(url, require_approval="never")]) as conn:
            await conn.until("mcp_list_tools.in_progress")
            async with asyncio.timeout(10):
                await connected.wait()
        await sessions_ended(server)
        assert not conn.of("mcp_list_tools.completed") and not conn.of("mcp_list_tools.failed")
    finally:
        listener.close()
        await listener.wait_closed()


async def test_the_result_is_spoken_in_audio(server: ServedApp, mcp_url: str) -> None:
    """With audio output the answer after the call is speech, its transcript the result."""
    async with session(
        server, [mcp_tool(mcp_url, allowed_tools=ONE, require_approval="never")], "audio"
    ) as conn:
        await conn.until("mcp_list_tools.completed")
        done = await conn.ask(QUESTION, **forced())
        assert conn.of("response.mcp_call.completed") and conn.of("response.output_audio.delta")
        transcript = conn.of("response.output_audio_transcript.done")[-1].transcript
        assert "21" in transcript or "sunny" in transcript.lower(), transcript
        assert done.response.status == "completed"


async def test_speech_during_a_call_cuts_it_off(server: ServedApp, mcp_url: str) -> None:
    """A barge-in (server VAD, the user speaks) while the call runs cancels the response
    and the call with it; the session closes with nothing left running. One tool offered:
    a cold Thinker given three tools' grammars can pass its 5 s hang bound on 2 cores."""
    async with session(
        server, [mcp_tool(mcp_url, allowed_tools=["slow_weather"], require_approval="never")]
    ) as conn:
        await conn.until("mcp_list_tools.completed")
        await conn.conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": QUESTION}],
            }
        )
        await conn.conn.response.create(response=forced("slow_weather"))
        await conn.until("response.mcp_call.in_progress", within_s=60)
        pcm = np.concatenate(
            [trim_silence(speak("Never mind, stop.", rate=24_000)), silence(800, 24_000)]
        )
        for start in range(0, len(pcm), 2_400):  # 100 ms appends
            chunk = pcm[start : start + 2_400].astype("<i2").tobytes()
            await conn.conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
        done = await conn.until("response.done", within_s=20)
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "turn_detected"
        call = next(i for i in done.response.output if i.type == "mcp_call")
        assert call.output is None and not conn.of("response.mcp_call.completed")
