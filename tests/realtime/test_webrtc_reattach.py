"""A WebRTC call whose peer connection drops re-attaches to its session with a new offer.

Real aiortc callers over loopback (loadtest.webrtc_client) against the app in process on
the fake engine (answers of 6 s of audio, made 4x faster than real time, so one is still
playing when the connection drops). The drop is the caller's peer connection closed with
no hang-up, as a phone's is when it changes networks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from realtime.transports.webrtc.call import PEER_FAILED
from web.app import Services

from .apps import asgi_client, fake_app


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(
        tmp_path, redis_url, "audio_ms: 6000, realtime_factor: 4.0", max_sessions=4
    ) as running:
        yield running


@pytest.fixture
async def callers(http: httpx.AsyncClient) -> AsyncIterator[list[Caller]]:
    """Callers made by the test, all closed after it."""
    made: list[Caller] = []
    yield made
    for caller in made:
        await caller.close()


def question() -> np.ndarray:
    return np.concatenate([silence(300), trim_silence(speak("What is the weather like today?"))])


def services_of(app: Starlette) -> Services:
    services: Services = app.state.services
    return services


def claim(created: dict[str, Any], last_event_id: str | None = None) -> dict[str, str]:
    """The headers of a re-attach to the session that `session.created` announced."""
    headers = {
        "X-Parley-Session-Id": created["session"]["id"],
        "X-Parley-Resume-Token": created["session"]["parley"]["resume_token"],
    }
    if last_event_id is not None:
        headers["X-Parley-Last-Event-Id"] = last_event_id
    return headers


async def channel_open(caller: Caller) -> None:
    """Wait until the caller's data channel is open (a re-attach may have nothing to
    replay, so no event says so)."""
    if caller.channel.readyState != "open":
        opened = asyncio.Event()
        caller.channel.on("open", opened.set)
        async with asyncio.timeout(10):
            await opened.wait()


async def started_call(
    http: httpx.AsyncClient, callers: list[Caller]
) -> tuple[Caller, dict[str, Any]]:
    caller = Caller(http)
    callers.append(caller)
    response = await caller.connect()
    assert response.status_code == 201, response.text
    return caller, await caller.wait_for(lambda e: e["type"] == "session.created")


async def test_a_dropped_call_re_attaches_to_its_session_with_a_new_offer(
    http: httpx.AsyncClient, app: Starlette, callers: list[Caller]
) -> None:
    first, created = await started_call(http, callers)
    session_id = created["session"]["id"]
    first.send(
        {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}
    )
    await first.wait_for(lambda e: e["type"] == "session.updated")
    first.mic.say(question())
    user_item = await first.wait_for(lambda e: e["type"] == "input_audio_buffer.committed")
    await first.wait_for(lambda e: e["type"] == "output_audio_buffer.started", within_s=30)
    answer = await first.wait_for(lambda e: e["type"] == "response.output_item.added")
    await asyncio.sleep(1.0)  # a second of the 6 s answer is played

    last_seen = first.events[-1]["event_id"]
    await first.pc.close()  # the network changed: no hang-up

    second = Caller(http)
    callers.append(second)
    response = await second.connect(headers=claim(created, last_seen))
    assert response.status_code == 201, response.text
    # The answer that was playing ended, cut to what was played.
    truncated = await second.wait_for(lambda e: e["type"] == "conversation.item.truncated")
    assert truncated["item_id"] == answer["item"]["id"]
    assert 500 <= truncated["audio_end_ms"] <= 4_000, truncated
    assert "session.created" not in second.types()  # nothing it had seen is sent again
    # The same session, its history and settings.
    second.send({"type": "conversation.item.retrieve", "item_id": user_item["item_id"]})
    retrieved = await second.wait_for(lambda e: e["type"] == "conversation.item.retrieved")
    assert retrieved["item"]["id"] == user_item["item_id"]
    second.send({"type": "session.update", "session": {"type": "realtime"}})
    updated = await second.wait_for(lambda e: e["type"] == "session.updated")
    assert updated["session"]["id"] == session_id
    assert updated["session"]["instructions"] == "Be brief."
    manager = services_of(app).manager
    assert manager is not None and len(manager) == 1
    # A new turn is answered aloud on the new call's track.
    asked_at = time.monotonic()
    second.mic.say(question())
    await second.wait_for(lambda e: e["type"] == "output_audio_buffer.started", within_s=30)
    await asyncio.sleep(1.0)
    assert len(second.loud_since(asked_at)) > 20  # 20 ms frames: over 0.4 s of sound
    assert second.call_id is not None
    hangup = await http.post(f"/v1/realtime/calls/{second.call_id}/hangup")
    assert hangup.status_code == 200
    assert len(manager) == 0


async def test_a_hang_up_as_the_peer_drops_ends_the_session_at_once(
    http: httpx.AsyncClient, app: Starlette, callers: list[Caller]
) -> None:
    """The app hangs up just as the call's peer connection fails (a broken network, a bad
    offer's ICE): the session ends with the call, not kept for a re-attach nobody makes."""
    first, _ = await started_call(http, callers)
    services = services_of(app)
    assert first.call_id is not None and services.calls is not None
    services.calls.get(first.call_id).request_close(PEER_FAILED)  # as the call's watch sees it
    hangup = await http.post(f"/v1/realtime/calls/{first.call_id}/hangup")
    assert hangup.status_code in (200, 404)  # 404: the call had already gone
    manager = services.manager
    assert manager is not None and len(manager) == 0


async def test_a_wrong_claim_is_refused_and_an_abandoned_session_ends_after_the_grace(
    http: httpx.AsyncClient, app: Starlette, callers: list[Caller]
) -> None:
    services = services_of(app)
    services.resume_grace_s = 0.5
    first, created = await started_call(http, callers)
    wrong = claim(created) | {"X-Parley-Resume-Token": "not-the-token"}
    callers.extend([Caller(http), Caller(http)])
    refused = await callers[1].connect(headers=wrong)
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"]["code"] == "session_not_found"
    half = {"X-Parley-Session-Id": created["session"]["id"]}
    assert (await callers[2].connect(headers=half)).status_code == 400
    manager = services.manager
    assert manager is not None and len(manager) == 1  # the live call goes on

    dropped_at = time.monotonic()
    await first.pc.close()
    async with asyncio.timeout(15):
        while len(manager):
            await asyncio.sleep(0.05)
    assert time.monotonic() - dropped_at >= 0.5
    late = Caller(http)
    callers.append(late)
    assert (await late.connect(headers=claim(created))).status_code == 404


@pytest.fixture
async def other_app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    """A second server process on the same Redis."""
    directory = tmp_path / "other"
    directory.mkdir()
    async with fake_app(
        directory, redis_url, "audio_ms: 6000, realtime_factor: 4.0", max_sessions=4
    ) as running:
        yield running


async def test_a_call_re_attaches_on_another_worker(
    http: httpx.AsyncClient, app: Starlette, other_app: Starlette, callers: list[Caller]
) -> None:
    first, created = await started_call(http, callers)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    first.send({"type": "conversation.item.create", "item": item})
    said = await first.wait_for(lambda e: e["type"] == "conversation.item.added")
    first.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Hm."}})
    await first.wait_for(lambda e: e["type"] == "session.updated")
    last_seen = first.events[-1]["event_id"]
    await first.pc.close()

    async with asgi_client(other_app) as other_http:
        second = Caller(other_http)
        callers.append(second)
        response = await second.connect(headers=claim(created, last_seen))
        assert response.status_code == 201, response.text
        await channel_open(second)
        second.send({"type": "conversation.item.retrieve", "item_id": said["item"]["id"]})
        retrieved = await second.wait_for(lambda e: e["type"] == "conversation.item.retrieved")
        assert retrieved["item"]["content"][0]["text"] == "Hi"
        second.send({"type": "session.update", "session": {"type": "realtime"}})
        updated = await second.wait_for(lambda e: e["type"] == "session.updated")
        assert updated["session"]["id"] == created["session"]["id"]
        assert updated["session"]["instructions"] == "Hm."
        here, there = services_of(app).manager, services_of(other_app).manager
        assert here is not None and there is not None
        assert len(there) == 1
        async with asyncio.timeout(10):  # the first worker let go of it
            while len(here):
                await asyncio.sleep(0.05)
        assert second.call_id is not None
        assert (
            await other_http.post(f"/v1/realtime/calls/{second.call_id}/hangup")
        ).status_code == 200
