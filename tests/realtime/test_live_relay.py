"""A GPT-Live sideband that lands on another worker process than its session's: two apps
(two server processes, as `--workers 2` makes them) on one Redis, the official SDK's
`client.live` on one and its `client.live.sideband` on the other, relayed over Redis
(realtime/sideband_relay.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.live import SessionConfigParam
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.realtime.apps import ServedApp, two_workers

KEY = "sk-test-parley-relay"
START: SessionConfigParam = {"model": "gpt-live-1", "instructions": "You are terse."}


@pytest.fixture
async def apps(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[ServedApp, ServedApp]]:
    async with two_workers(
        tmp_path, redis_url, KEY, "audio_ms: 2000, realtime_factor: 4.0"
    ) as both:
        yield both


@contextlib.asynccontextmanager
async def started_on(
    owner: ServedApp, other: ServedApp
) -> AsyncIterator[tuple[Any, AsyncOpenAI, str]]:
    """A device's session on `owner`, and an app's client of `other`."""
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{owner.http_url}/v1") as device_client,
        AsyncOpenAI(api_key=KEY, base_url=f"{other.http_url}/v1") as app_client,
        device_client.live.connect() as device,
    ):
        await device.session.start(session=START)
        session_id = (await until(device, "session.started")).session.id
        yield device, app_client, session_id


async def until(conn: Any, kind: str, timeout_s: float = 10) -> Any:
    async with asyncio.timeout(timeout_s):
        while (event := await conn.recv()).type != kind:
            pass
    return event


async def test_a_sideband_on_another_worker_reads_and_controls_the_session(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    owner, other = apps
    async with started_on(owner, other) as (device, app_client, session_id):
        assert other.app.state.services.live_sessions.get(session_id) is None  # not local
        async with app_client.live.sideband.connect(session_id=session_id) as controller:
            await controller.session.instructions.append(
                content="Answer in French.", delegation_id=None, event_id="side-1"
            )
            seen_by_controller = await until(controller, "session.instructions.appended")
            seen_by_device = await until(device, "session.instructions.appended")
            assert seen_by_controller.client_event_id == "side-1"
            assert seen_by_device.client_event_id == "side-1"

            append = {"type": "session.input_audio.append", "audio": "AAAA"}
            await controller.send(append)  # type: ignore[arg-type]
            refused = await until(controller, "error")
            assert refused.error.param == "type"

            await controller.session.input_audio.mute(event_id="m")
            assert (await until(device, "session.input_audio.muted")).client_event_id == "m"
            await controller.session.close(event_id="bye")
            closed = await until(controller, "session.closed")
            assert closed.reason == "close_requested"
            assert (await until(device, "session.closed")).reason == "close_requested"
    async with asyncio.timeout(5):
        while len(owner.app.state.services.live_sessions):
            await asyncio.sleep(0.05)


async def test_a_sideband_detaching_leaves_the_session_and_a_gone_one_is_refused(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    owner, other = apps
    headers = {"Authorization": f"Bearer {KEY}"}
    async with started_on(owner, other) as (device, app_client, session_id):
        async with app_client.live.sideband.connect(session_id=session_id) as controller:
            await controller.session.input_audio.mute(event_id="m1")
            await until(controller, "session.input_audio.muted")
        # the sideband left; the session goes on and takes a second one
        async with app_client.live.sideband.connect(session_id=session_id) as again:
            await again.session.input_audio.unmute(event_id="u1")
            assert (await until(device, "session.input_audio.unmuted")).client_event_id == "u1"
        await device.session.close()
        await until(device, "session.closed")
    url = f"{other.ws_url}/v1/live/sessions/{session_id}/attach"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, additional_headers=headers):
            pass
    assert refused.value.response.status_code == 404
