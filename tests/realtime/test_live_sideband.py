"""GPT-Live's sideband (`/v1/live/sessions/{id}/attach`): the official SDK's
`client.live.sideband` attached to a session the SDK's `client.live` holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.live import SessionConfigParam

from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from web.settings import Settings

KEY = "sk-test-parley-sideband"
START: SessionConfigParam = {"model": "gpt-live-1", "instructions": "You are terse."}


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path, "audio_ms: 2000, realtime_factor: 4.0")
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as served:
        yield served


async def until(conn: Any, kind: str, timeout_s: float = 10) -> Any:
    """The next event of `kind` (what comes before it, audio included, is skipped)."""
    async with asyncio.timeout(timeout_s):
        while (event := await conn.recv()).type != kind:
            pass
    return event


async def test_a_sideband_reads_the_session_and_controls_it(server: ServedApp) -> None:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.live.connect() as device,
    ):
        await device.session.start(session=START)
        started = await until(device, "session.started")
        session_id = started.session.id
        async with client.live.sideband.connect(session_id=session_id) as controller:
            await asyncio.sleep(0.2)  # attached once the upgrade is answered
            await controller.session.instructions.append(
                content="Answer in French.", delegation_id=None, event_id="side-1"
            )
            seen_by_controller = await until(controller, "session.instructions.appended")
            seen_by_device = await until(device, "session.instructions.appended")
            assert seen_by_controller.client_event_id == "side-1"
            assert seen_by_device.client_event_id == "side-1"

            append = {"type": "session.input_audio.append", "audio": "AAAA"}  # not the SDK's
            await controller.send(append)  # type: ignore[arg-type]
            refused = await until(controller, "error")
            assert refused.error.param == "type"

            await controller.session.input_audio.mute(event_id="m")
            assert (await until(device, "session.input_audio.muted")).client_event_id == "m"

            await device.session.close()
            closed = await until(controller, "session.closed")
            assert closed.reason == "close_requested"
    async with asyncio.timeout(5):
        while len(server.app.state.services.live_sessions):
            await asyncio.sleep(0.05)


async def test_attaching_to_an_unknown_session_is_refused(server: ServedApp) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    url = f"{server.ws_url}/v1/live/sessions/sess_nope/attach"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}):
            pass
    assert refused.value.response.status_code == 404


async def test_the_apps_hangup_ends_a_websocket_session(server: ServedApp) -> None:
    """`client.live.sessions.hangup(id)` on a session the device holds over a WebSocket:
    it ends as its own `session.close` would (`close_requested`); an unknown id is a 404."""
    import openai

    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.live.connect() as device,
    ):
        await device.session.start(session=START)
        session_id = (await until(device, "session.started")).session.id
        await client.live.sessions.hangup(session_id)
        closed = await until(device, "session.closed")
        assert closed.reason == "close_requested"
        with pytest.raises(openai.NotFoundError):
            await client.live.sessions.hangup("live_nope")
