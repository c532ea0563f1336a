"""An OpenAI Realtime sideband (`/v1/realtime?call_id=`) that lands on another worker
process than its call's: two apps (two server processes, as `--workers 2` makes them) on
one Redis, a real aiortc caller on one and the official SDK's `client.realtime` on the
other, relayed over Redis (realtime/sideband_relay.py, realtime/call_index.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from loadtest.webrtc_client import Caller
from tests.realtime.apps import ServedApp, two_workers
from tests.realtime.clients import RecordingClient

KEY = "sk-test-parley-sideband-relay"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
async def apps(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[ServedApp, ServedApp]]:
    async with two_workers(tmp_path, redis_url, KEY) as both:
        yield both


@pytest.fixture
async def caller(apps: tuple[ServedApp, ServedApp]) -> AsyncIterator[Caller]:
    """A WebRTC call on the first app."""
    async with httpx.AsyncClient(base_url=apps[0].http_url, headers=AUTH) as http:
        c = Caller(http)
        try:
            assert (await c.connect()).status_code == 201
            await c.wait_for(lambda e: e["type"] == "session.created")
            yield c
        finally:
            await c.close()


async def test_a_sideband_on_another_worker_steers_the_call_and_ends_with_it(
    apps: tuple[ServedApp, ServedApp], caller: Caller
) -> None:
    owner, other = apps
    call_id = caller.call_id
    assert call_id is not None
    other_calls = other.services.calls
    assert other_calls is not None and call_id not in other_calls.call_ids()  # not local
    async with AsyncOpenAI(api_key=KEY, base_url=f"{other.http_url}/v1") as client:
        async with client.realtime.connect(call_id=call_id) as conn:
            await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
            seen: list[str] = []
            async with asyncio.timeout(10):
                async for event in conn:
                    seen.append(event.type)
                    if event.type == "session.updated":
                        assert event.session.instructions == "Be brief."  # type: ignore[union-attr]
                        await conn.response.create()
                    if event.type == "response.done":
                        break
            assert "output_audio_buffer.started" in seen
        # The sideband left; the call goes on, and heard the answer on its track.
        await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", within_s=10)
        assert len(caller.loud_since(0)) > 20
        manager = owner.services.manager
        assert manager is not None and len(manager) == 1
        session = manager.sessions()[0]
        assert session.config.instructions == "Be brief."

    url = f"{other.ws_url}/v1/realtime?call_id={call_id}"
    async with connect(url, additional_headers=AUTH, proxy=None) as ws:  # attaching anew
        again = RecordingClient(ws)
        await again.send({"type": "response.create"})
        await again.wait_type("response.created")
        async with httpx.AsyncClient(base_url=owner.http_url, headers=AUTH) as http:
            assert (await http.post(f"/v1/realtime/calls/{call_id}/hangup")).status_code == 200
        with pytest.raises(ConnectionClosed) as closed:
            await again.read_to_the_end()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    assert closed.value.rcvd.reason.startswith("call_ended")


async def test_an_unknown_or_ended_call_is_refused_on_every_worker(
    apps: tuple[ServedApp, ServedApp], caller: Caller
) -> None:
    owner, other = apps
    async with httpx.AsyncClient(base_url=owner.http_url, headers=AUTH) as http:
        assert (await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")).status_code == 200
    for call_id in ("rtc_nope", caller.call_id):
        url = f"{other.ws_url}/v1/realtime?call_id={call_id}"
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url, additional_headers=AUTH, proxy=None):
                pass
        response = refused.value.response
        assert response.status_code == 404
        assert json.loads(response.body or b"{}")["error"]["code"] == "call_not_found"
