"""A sideband on a GPT-Live WebRTC session, as OpenAI's browser guide has it: the
application's server makes the session with the official SDK (`client.live.create`) from a
real aiortc page's offer, and attaches `client.live.sideband` to it. The page is restricted
by `client.data_channel`; the sideband (the application's own) is not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from loadtest.webrtc_client import Caller
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from web.settings import Settings

KEY = "sk-test-parley-live-webrtc-side"
SESSION = {
    "model": "gpt-live-1",
    "client": {
        "data_channel": {
            "allowed_client_events": [],
            "allowed_server_events": [{"type": "session.started"}],
        }
    },
}


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path, "audio_ms: 2000, realtime_factor: 4.0")
    async with served_app(Settings(pipeline=graph, api_key=KEY), redis_url) as served:
        yield served


async def until(conn: Any, kind: str) -> Any:
    async with asyncio.timeout(10):
        while (event := await conn.recv()).type != kind:
            pass
    return event


async def test_a_sideband_controls_a_webrtc_session_the_page_may_not(server: ServedApp) -> None:
    async with (
        httpx.AsyncClient(base_url=server.http_url) as http,
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
    ):
        page = Caller(http)
        try:
            # The application's server makes the session with the SDK, from the page's offer.
            created = await client.live.create(
                session=SESSION,  # type: ignore[arg-type]
                transport={"type": "webrtc", "sdp": await page.offer()},
            )
            await page.answered(created.transport.sdp)
            await page.wait_for(lambda e: e["type"] == "session.started")
            async with client.live.sideband.connect(session_id=created.session.id) as controller:
                await asyncio.sleep(0.2)  # attached once the upgrade is answered
                await controller.session.instructions.append(
                    content="Answer in French.", delegation_id=None, event_id="side-1"
                )
                appended = await until(controller, "session.instructions.appended")
                assert appended.client_event_id == "side-1"
                page.send({"type": "session.instructions.append", "content": "No."})
                await controller.session.close(event_id="bye")
                closed = await until(controller, "session.closed")
                assert closed.reason == "close_requested"
            async with asyncio.timeout(5):
                while len(server.services.calls or ()) or len(
                    server.app.state.services.live_sessions
                ):
                    await asyncio.sleep(0.05)
            assert page.types() == ["session.started"]  # all the page was allowed to read
        finally:
            await page.close()
