"""A sideband WebSocket (`/v1/realtime?call_id=`) on a running WebRTC call: a real aiortc
caller and a raw WebSocket client against one real uvicorn server with a fake engine.
The sideband sees the call's events, steers its session, makes it speak on the track, and
is closed when the call ends; an unknown call is a 404 before the upgrade."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from loadtest.webrtc_client import Caller
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from web.settings import Settings

KEY = "sk-test-parley-sideband"
AUTH = {"Authorization": f"Bearer {KEY}"}
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path, "audio_ms: 1500, realtime_factor: 4.0")
    async with served_app(Settings(pipeline=graph, api_key=KEY, max_sessions=2), redis_url) as s:
        yield s


@pytest.fixture
async def http(server: ServedApp) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.http_url, headers=AUTH) as client:
        yield client


@pytest.fixture
async def caller(http: httpx.AsyncClient) -> AsyncIterator[Caller]:
    c = Caller(http)
    try:
        assert (await c.connect()).status_code == 201
        await c.wait_for(lambda e: e["type"] == "session.created")
        yield c
    finally:
        await c.close()


@contextlib.asynccontextmanager
async def sideband(
    server: ServedApp, call_id: str, headers: dict[str, str] | None = None
) -> AsyncIterator[RecordingClient]:
    url = f"{server.ws_url}/v1/realtime?call_id={call_id}"
    async with connect(url, additional_headers=headers or AUTH, proxy=None) as ws:
        yield RecordingClient(ws)


async def test_the_sideband_steers_the_call_and_is_closed_when_it_ends(
    server: ServedApp, http: httpx.AsyncClient, caller: Caller
) -> None:
    assert caller.call_id is not None
    async with sideband(server, caller.call_id) as control:
        await control.send(
            {
                "type": "session.update",
                "event_id": "evt_sb_1",
                "session": {"type": "realtime", "instructions": "Answer like a pirate."},
            }
        )
        updated = await control.wait_type("session.updated")
        assert updated["session"]["instructions"] == "Answer like a pirate."
        session = server.services.manager
        assert session is not None
        assert session.get(updated["session"]["id"]).config.instructions == "Answer like a pirate."
        seen = await caller.wait_for(lambda e: e["type"] == "session.updated")
        assert seen["event_id"] == updated["event_id"]  # one session, one event

        await control.send({"type": "response.create"})
        created = await control.wait_type("response.created")
        await control.wait_type("output_audio_buffer.started")
        await control.wait_type("response.done")
        await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", within_s=10)
        assert len(caller.loud_since(0)) > 20  # the answer was heard on the call's track
        assert "response.output_audio.delta" not in [e["type"] for e in control.events]
        on_channel = [e["type"] for e in caller.events if e["type"] != "session.created"]
        heard = [e["type"] for e in control.events]
        assert heard == on_channel[: len(heard)]  # the same GA sequence as the data channel
        assert created["response"]["id"] == caller.events[-1]["response_id"]

        await control.send({"type": "input_audio_buffer.append", "audio": "AAAA"})
        refused = await control.wait_type("error")
        assert "audio track" in refused["error"]["message"]

        hangup = await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
        assert hangup.status_code == 200
        with pytest.raises(ConnectionClosed) as closed:
            await control.read_to_the_end()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
        assert closed.value.rcvd.reason.startswith("call_ended")
    for event in control.events:
        SERVER_EVENT.validate_python(event)


async def test_closing_the_sideband_leaves_the_call_running(
    server: ServedApp, caller: Caller
) -> None:
    assert caller.call_id is not None
    async with sideband(server, caller.call_id) as control:
        await control.send({"type": "response.create"})
        await control.wait_type("response.created")
    await caller.wait_for(lambda e: e["type"] == "response.done", within_s=10)
    calls = server.services.calls
    assert calls is not None
    call = calls.get(caller.call_id)
    assert call.events.listeners == 0
    async with sideband(server, caller.call_id) as again:  # attaching anew works
        await again.send({"type": "session.update", "session": {"type": "realtime"}})
        await again.wait_type("session.updated")
    await asyncio.sleep(0.1)
    assert calls.get(caller.call_id) is call


async def test_the_openai_sdk_joins_the_call_as_a_sideband(
    server: ServedApp, http: httpx.AsyncClient, caller: Caller
) -> None:
    assert caller.call_id is not None
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.realtime.connect(call_id=caller.call_id) as conn,
    ):
        await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        await conn.response.create()
        seen: list[str] = []
        async with asyncio.timeout(15):
            async for event in conn:
                seen.append(event.type)
                if event.type == "response.done":
                    assert event.response.status == "completed"
                    await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
        # The iteration ends when the server closes the sideband, as the call ended.
    assert seen.index("session.updated") < seen.index("response.created")
    assert "response.output_item.done" in seen and "output_audio_buffer.started" in seen


@pytest.mark.parametrize(
    ("call_id", "headers", "status", "code"),
    [
        ("rtc_nope", AUTH, 404, "call_not_found"),
        ("rtc_nope", {"Authorization": "Bearer sk-wrong"}, 401, "invalid_api_key"),
    ],
)
async def test_an_unknown_call_or_a_bad_key_is_refused_before_the_upgrade(
    server: ServedApp, call_id: str, headers: dict[str, str], status: int, code: str
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with sideband(server, call_id, headers):
            pass
    response = refused.value.response
    assert response.status_code == status
    assert json.loads(response.body or b"{}")["error"]["code"] == code
