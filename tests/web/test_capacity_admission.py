"""Admission held to what the graph can serve: the session cap is the smaller of
--max-sessions and the pipeline's capacity, shown on /readyz and /metrics, and every protocol
refuses past it in its own words; a turn that finds no cache row in time fails its response
with `server_busy`, which the client reads in the failed response."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
from websockets.asyncio.client import connect

from loadtest.webrtc_client import Caller
from tests.realtime.apps import ServedApp, served_app
from tests.realtime.clients import RecordingClient
from web.settings import Settings

ROWED = "tests.fakes.stage_engines:Rowed"


def tone(seconds: float, rate: int = 24_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 220.0 * t) * 8000).astype(np.int16)


def graph_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "graph.yaml"
    path.write_text(body)
    return str(path)


@contextlib.asynccontextmanager
async def realtime(server: ServedApp) -> AsyncIterator[RecordingClient]:
    """A Realtime WebSocket session with manual turns."""
    async with connect(f"{server.ws_url}/v1/realtime?model=parley", max_size=None) as ws:
        client = RecordingClient(ws, wait_s=30)
        await client.wait_type("session.created")
        await client.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
            }
        )
        await client.wait_type("session.updated")
        yield client


async def test_the_session_cap_is_the_graphs_capacity_on_every_transport(
    tmp_path: Path, redis_url: str
) -> None:
    graph = graph_file(
        tmp_path,
        "name: rowed\nstages:\n"
        f"  - {{name: duplex, engine: '{ROWED}', engine_args: {{rows: 2, holds: session}}}}\n"
        "outputs: [duplex]\n",
    )
    async with (
        served_app(Settings(pipeline=graph, max_sessions=64), redis_url) as server,
        httpx.AsyncClient(base_url=server.http_url) as http,
    ):
        assert server.manager.max_sessions == 2
        ready = (await http.get("/readyz")).json()
        assert ready["max_sessions"] == 2 and ready["capacity"]["sessions"] == 2
        assert "duplex: 2 cache rows" in ready["capacity"]["stages"][0]
        assert "parley_session_cap 2.0" in (await http.get("/metrics")).text
        async with realtime(server) as first:
            caller = Caller(http)
            try:
                assert (await caller.connect()).status_code == 201  # the second slot
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
                    assert "all 2 session slots" in error["error"]["message"]
                await first.ask(tone(0.5))  # the sessions admitted are served
                done = await first.wait_type("response.done")
                assert done["response"]["status"] == "completed"
            finally:
                await caller.close()


def one_row_graph() -> str:
    """The tiny Qwen3-Omni in this process with one cache row a stage and no place to wait:
    a second turn while the first holds the row is refused at once."""
    rows = "decode_rows: 1, waiting: 0, row_wait_s: 0.0, max_context: 2048"
    return f"""\
name: one_row
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {{tiny: true, threads: 1, max_new_tokens: 40, min_new_tokens: 40, {rows}}}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {{tiny: true, threads: 1, max_frames: 4, min_frames: 4, {rows}}}
  - name: code2wav
    engine: qwen3_omni.code2wav
    engine_args: {{tiny: true, first_chunk: 2, chunk: 3, left_context: 3}}
edges:
  - {{from: thinker, to: talker}}
  - {{from: talker, to: code2wav}}
outputs: [thinker, code2wav]
"""


async def test_a_turn_that_finds_no_row_fails_its_response_with_server_busy(
    tmp_path: Path, redis_url: str
) -> None:
    graph = graph_file(tmp_path, one_row_graph())
    async with served_app(Settings(pipeline=graph, max_sessions=64), redis_url) as server:
        assert server.manager.max_sessions == 1  # one row and no place to wait
        server.manager.leases.cap = 2  # let a second session in, to see its turn refused
        async with realtime(server) as first, realtime(server) as second:
            await first.ask(tone(0.3))
            await first.wait_type("response.output_audio_transcript.delta")  # holds its row
            await second.ask(tone(0.3))
            error = await second.wait_type("error")
            assert error["error"]["code"] == "server_busy"
            assert "all 1 rows of the graph are busy" in error["error"]["message"]
            done = await second.wait_type("response.done")
            assert done["response"]["status"] == "failed"
            assert "server_busy" not in json.dumps(first.events)  # the first is served
            served = await first.wait_type("response.done", within_s=60)
            assert served["response"]["status"] == "completed"
