"""The acceptance list for an omni serving stack, end to end on the echo graph.

Each test runs the real app under uvicorn on a loopback port with real clients: a slow
downstream stage, a stage cancelled mid-stream, a client interrupting, a long input,
concurrent sessions of different modalities, a memory bound reached, and a connector
that goes away (a worker process killed mid-answer).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from websockets.asyncio.client import connect

from loadtest.abort_bench import stages_idle
from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from pipeline.graph import StageGraph
from pipeline.worker import WorkerEngine
from tests.realtime.apps import ServedApp, served_app
from tests.realtime.clients import RecordingClient
from web.settings import Settings

RELAY = "tests.fakes.stage_engines:Relay"


def tone(seconds: float, rate: int = 24_000, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * hz * t) * 8000).astype(np.int16)


def jpeg(shade: int, size: int = 64) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), (shade % 256, (shade * 7) % 256, (shade * 13) % 256)).save(
        out, "JPEG"
    )
    return out.getvalue()


@contextlib.asynccontextmanager
async def realtime(server: ServedApp, manual: bool = False) -> AsyncIterator[RecordingClient]:
    async with connect(f"{server.ws_url}/v1/realtime?model=parley", max_size=None) as ws:
        client = RecordingClient(ws, wait_s=20)
        await client.wait_type("session.created")
        if manual:
            await client.send(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                }
            )
            await client.wait_type("session.updated")
        yield client


async def idle(server: ServedApp, within_s: float = 5.0) -> None:
    """Every stage of the pipeline holds no request (worker stages asked over their link)."""
    graph = server.services.pipeline
    assert isinstance(graph, StageGraph)
    async with asyncio.timeout(within_s):
        await stages_idle(graph)


def graph_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "graph.yaml"
    path.write_text(body)
    return str(path)


@pytest.fixture
def slow_graph(tmp_path: Path) -> str:
    """echo -> relay -> relay, the middle one slow: a slow downstream stage."""
    return graph_file(
        tmp_path,
        "name: slow\nstages:\n"
        "  - {name: echo, engine: echo}\n"
        f"  - {{name: slow, engine: '{RELAY}', engine_args: {{delay_s: 0.03}}}}\n"
        f"  - {{name: last, engine: '{RELAY}'}}\n"
        "edges:\n  - {from: echo, to: slow}\n  - {from: slow, to: last}\n"
        "outputs: [last]\n",
    )


async def test_a_slow_downstream_stage_delivers_the_whole_answer(
    slow_graph: str, redis_url: str
) -> None:
    async with (
        served_app(Settings(pipeline=slow_graph), redis_url) as server,
        realtime(server, manual=True) as client,
    ):
        await client.ask(tone(3.0))
        done = await client.wait_type("response.done", within_s=30)
        assert done["response"]["status"] == "completed"
        # Every chunk came through the slow stage: the answer is the whole 3 s input.
        assert client.audio_ms(done["response"]["id"]) == pytest.approx(3000, abs=120)
        await idle(server)


async def test_an_answer_cancelled_mid_stream_leaves_no_stage_holding_it(
    slow_graph: str, redis_url: str
) -> None:
    async with (
        served_app(Settings(pipeline=slow_graph), redis_url) as server,
        realtime(server, manual=True) as client,
    ):
        await client.ask(tone(20.0))
        await client.wait_type("response.output_audio.delta")
        await client.send({"type": "response.cancel"})
        done = await client.wait_type("response.done")
        assert done["response"]["status"] == "cancelled"
        await idle(server)
        # The session goes on: the next answer is whole.
        await client.ask(tone(1.0))
        done = await client.wait_type("response.done", within_s=30)
        assert done["response"]["status"] == "completed"
        assert client.audio_ms(done["response"]["id"]) == pytest.approx(1000, abs=120)


async def test_a_client_interrupting_by_speaking_cuts_the_answer(redis_url: str) -> None:
    question = trim_silence(speak("What is the weather like today in the mountains?", 24_000))
    async with (
        served_app(Settings(pipeline="echo"), redis_url) as server,
        realtime(server) as client,
    ):
        await client.append(np.concatenate([question, silence(900, 24_000)]), chunk_ms=100)
        first = await client.wait_type("response.created", within_s=20)
        await client.wait_type("response.output_audio.delta")
        await client.append(np.concatenate([question, silence(900, 24_000)]), chunk_ms=100)
        done = await client.wait_for(
            lambda e: (
                e["type"] == "response.done" and e["response"]["id"] == first["response"]["id"]
            ),
        )
        assert done["response"]["status"] == "cancelled"
        truncated = await client.wait_type("conversation.item.truncated")
        assert 0 < truncated["audio_end_ms"] < len(question) * 1000 / 24_000
        second = await client.wait_for(
            lambda e: (
                e["type"] == "response.done" and e["response"]["id"] != first["response"]["id"]
            ),
            within_s=30,
        )
        assert second["response"]["status"] == "completed"
        await idle(server)


async def test_a_long_input_is_bounded_and_answered(redis_url: str) -> None:
    """Three minutes of audio in one turn (the buffer keeps the newest 120 s), and 300
    camera frames on the video chat stream (the cache keeps `max_frames`)."""
    async with served_app(Settings(pipeline="echo"), redis_url) as server:
        async with realtime(server, manual=True) as client:
            await client.send(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "output_modalities": ["text"]},
                }
            )
            await client.wait_type("session.updated")
            await client.append(tone(180.0), chunk_ms=10_000)
            await client.send({"type": "input_audio_buffer.commit"})
            await client.send({"type": "response.create"})
            done = await client.wait_type("response.done", within_s=30)
            assert done["response"]["status"] == "completed"
            heard = re.search(r"echo of ([0-9.]+) s", json.dumps(done["response"]["output"]))
            assert heard is not None
            assert 119.0 <= float(heard.group(1)) <= 121.0  # capped (approximately) at 120 s
        async with connect(f"{server.ws_url}/v1/video/chat/stream", max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "max_frames": 16, "num_frames": 4}))
            for shade in range(300):
                data = base64.b64encode(jpeg(shade)).decode()
                await ws.send(json.dumps({"type": "video.frame", "data": data}))
            await ws.send(json.dumps({"type": "video.query", "text": "What do you see?"}))
            async with asyncio.timeout(20):
                while (message := json.loads(await ws.recv()))["type"] != "response.text.done":
                    assert message["type"] != "error", message
        await idle(server)
        assert server.services.manager is not None
        async with asyncio.timeout(5):
            while len(server.services.manager):
                await asyncio.sleep(0.02)


async def test_sessions_of_every_modality_at_once(redis_url: str) -> None:
    """A WebRTC call, an OpenAI WebSocket session and a video chat stream, all answered
    while the others are live."""
    question = trim_silence(speak("Can you hear me now?"))
    async with (
        served_app(Settings(pipeline="echo"), redis_url) as server,
        httpx.AsyncClient(base_url=server.http_url) as http,
    ):
        caller = Caller(http)
        try:
            assert (await caller.connect()).status_code == 201

            async def webrtc() -> None:
                await caller.wait_for(lambda e: e["type"] == "session.created")
                caller.mic.say(np.concatenate([question, silence(900)]))
                done = await caller.wait_for(lambda e: e["type"] == "response.done", 30)
                assert done["response"]["status"] == "completed"

            async def websocket() -> None:
                async with realtime(server, manual=True) as client:
                    await client.ask(tone(2.0))
                    done = await client.wait_type("response.done", within_s=30)
                    assert done["response"]["status"] == "completed"
                    assert client.audio_ms(done["response"]["id"]) > 1500

            async def video() -> None:
                async with connect(f"{server.ws_url}/v1/video/chat/stream") as ws:
                    await ws.send(json.dumps({"type": "session.config"}))
                    for shade in range(8):
                        data = base64.b64encode(jpeg(shade * 30)).decode()
                        await ws.send(json.dumps({"type": "video.frame", "data": data}))
                    await ws.send(json.dumps({"type": "video.query", "text": "Hello there"}))
                    texts = []
                    async with asyncio.timeout(30):
                        while (message := json.loads(await ws.recv()))[
                            "type"
                        ] != "response.text.done":
                            assert message["type"] != "error", message
                            if message["type"] == "response.text.delta":
                                texts.append(message["delta"])
                    assert "Hello there" in "".join(texts)

            async with asyncio.TaskGroup() as group:
                group.create_task(webrtc())
                group.create_task(websocket())
                group.create_task(video())
        finally:
            await caller.close()
        await idle(server)


async def test_at_the_session_cap_every_transport_refuses_cleanly(redis_url: str) -> None:
    """A memory bound reached: with the cap full, a new session is refused on each
    transport with its own signal, and the sessions already live are not disturbed."""
    async with (
        served_app(Settings(pipeline="echo", max_sessions=2), redis_url) as server,
        httpx.AsyncClient(base_url=server.http_url) as http,
        realtime(server, manual=True) as first,
    ):
        caller = Caller(http)
        try:
            assert (await caller.connect()).status_code == 201
            late = Caller(http)
            try:
                refused = await late.connect()
                assert refused.status_code == 503
                assert refused.json()["error"]["code"] == "session_limit"
            finally:
                await late.close()
            async with connect(f"{server.ws_url}/v1/realtime?model=parley") as ws:
                error = json.loads(await ws.recv())
                assert error["type"] == "error"
                assert error["error"]["code"] == "session_limit"
            # The live WebSocket session still answers.
            await first.ask(tone(1.0))
            done = await first.wait_type("response.done", within_s=30)
            assert done["response"]["status"] == "completed"
        finally:
            await caller.close()


@pytest.mark.slow
async def test_a_killed_worker_fails_the_answer_and_the_next_one_works(
    tmp_path: Path, redis_url: str
) -> None:
    """A connector that goes away: the echo stage in a worker process, killed mid-answer."""
    graph = graph_file(
        tmp_path,
        "name: worker\nstages:\n"
        "  - {name: echo, engine: echo, placement: {process: worker}}\n"
        f"  - {{name: slow, engine: '{RELAY}', engine_args: {{delay_s: 0.03}}}}\n"
        "edges:\n  - {from: echo, to: slow}\noutputs: [slow]\n",
    )
    async with (
        served_app(Settings(pipeline=graph), redis_url) as server,
        realtime(server, manual=True) as client,
    ):
        pipeline = server.services.pipeline
        assert isinstance(pipeline, StageGraph)
        worker = pipeline.engines["echo"]
        assert isinstance(worker, WorkerEngine) and worker.pid is not None
        await client.ask(tone(20.0))
        await client.wait_type("response.output_audio.delta")
        os.kill(worker.pid, signal.SIGKILL)
        done = await client.wait_type("response.done")
        assert done["response"]["status"] == "failed"
        if not any(e["type"] == "error" for e in client.events):  # before or after the done
            await client.wait_type("error", within_s=5)
        async with asyncio.timeout(20):
            while True:  # the worker comes back; the session is still there
                await client.ask(tone(1.0))
                done = await client.wait_type("response.done", within_s=20)
                if done["response"]["status"] == "completed":
                    break
                await asyncio.sleep(0.5)
        assert client.audio_ms(done["response"]["id"]) == pytest.approx(1000, abs=120)
