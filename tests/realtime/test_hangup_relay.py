"""Hang-ups that land on another worker process than their session's or call's: two apps
(two server processes, as `--workers 2` makes them) on one Redis, the session or call on
one and the app's hang-up, through the official SDK, on the other, relayed over Redis to
the owner's own route (web/call_controls.py, realtime/request_relay.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from loadtest.webrtc_client import Caller
from realtime import request_relay
from sessions.process_beat import Request
from tests.realtime.apps import ServedApp, two_workers
from tests.realtime.test_live_relay import KEY, START, started_on, until
from web import call_controls

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
async def apps(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[ServedApp, ServedApp]]:
    async with two_workers(tmp_path, redis_url, KEY) as both:
        yield both


async def no_live_sessions(app: ServedApp) -> None:
    async with asyncio.timeout(5):
        while len(app.services.live_sessions):
            await asyncio.sleep(0.05)


async def test_a_live_websocket_session_is_hung_up_through_another_worker(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    owner, other = apps
    async with started_on(owner, other) as (device, app_client, session_id):
        assert other.services.live_sessions.get(session_id) is None  # not local
        await app_client.live.sessions.hangup(session_id)  # 200, or the SDK raises
        closed = await until(device, "session.closed")
        assert closed.reason == "close_requested"
    await no_live_sessions(owner)


async def test_a_live_webrtc_session_is_hung_up_through_another_worker(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    owner, other = apps
    async with httpx.AsyncClient(base_url=owner.http_url, headers=AUTH) as http:
        caller = Caller(http)
        try:
            assert (await caller.connect_live(dict(START))).status_code == 201
            await caller.wait_for(lambda e: e["type"] == "session.started")
            assert caller.session_id is not None
            async with AsyncOpenAI(api_key=KEY, base_url=f"{other.http_url}/v1") as client:
                await client.live.sessions.hangup(caller.session_id)
            closed = await caller.wait_for(lambda e: e["type"] == "session.closed")
            assert closed["reason"] == "close_requested"
        finally:
            await caller.close()
    await no_live_sessions(owner)


async def test_a_webrtc_call_is_hung_up_through_another_worker(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    owner, other = apps
    owner_calls = owner.services.calls
    assert owner_calls is not None
    async with (
        httpx.AsyncClient(base_url=owner.http_url, headers=AUTH) as http,
        AsyncOpenAI(api_key=KEY, base_url=f"{other.http_url}/v1") as client,
    ):
        caller = Caller(http)
        try:
            assert (await caller.connect()).status_code == 201
            await caller.wait_for(lambda e: e["type"] == "session.created")
            call_id = caller.call_id
            assert call_id is not None and call_id in owner_calls.call_ids()
            await client.realtime.calls.hangup(call_id)
            assert call_id not in owner_calls.call_ids()  # it ended before the 200
            assert len(owner.manager) == 0
            async with asyncio.timeout(5):  # the caller's peer connection was closed for it
                while caller.pc.connectionState != "closed":
                    await asyncio.sleep(0.05)
            with pytest.raises(openai.NotFoundError):  # ended: no worker has it
                await client.realtime.calls.hangup(call_id)
        finally:
            await caller.close()


async def test_an_unknown_id_is_not_found_on_either_api(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    _, other = apps
    async with AsyncOpenAI(api_key=KEY, base_url=f"{other.http_url}/v1") as client:
        with pytest.raises(openai.NotFoundError) as live:
            await client.live.sessions.hangup("live_nope")
        with pytest.raises(openai.NotFoundError) as call:
            await client.realtime.calls.hangup("rtc_nope")
    assert live.value.code == "session_not_found"
    assert call.value.code == "call_not_found"


async def test_an_owner_that_does_not_answer_is_a_503(
    apps: tuple[ServedApp, ServedApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, other = apps
    monkeypatch.setattr(request_relay, "TAKEN_S", 0.5)
    released = asyncio.Event()

    async def stalled(request: Request) -> None:  # alive, but it never gets to the hang-up
        await released.wait()

    owner.manager.serve_requests(request_relay.OP, stalled)
    try:
        async with started_on(owner, other) as (device, _, session_id):
            async with AsyncOpenAI(
                api_key=KEY, base_url=f"{other.http_url}/v1", max_retries=0
            ) as client:
                with pytest.raises(openai.InternalServerError) as refused:
                    await client.live.sessions.hangup(session_id)
            assert refused.value.status_code == 503
            assert refused.value.code == "owner_unavailable"
            await device.session.close()  # it went on
            assert (await until(device, "session.closed")).reason == "close_requested"
    finally:
        released.set()
    await no_live_sessions(owner)


async def test_an_owner_that_takes_a_hangup_on_but_never_answers_is_a_503_in_time(
    apps: tuple[ServedApp, ServedApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay itself waits up to 75 s for an answer (a transfer's); a hang-up no longer
    than its own bound (`HANGUP_S`, 5 s)."""
    owner, other = apps
    monkeypatch.setattr(call_controls, "HANGUP_S", 1.0)
    redis = owner.services.redis
    assert redis is not None
    released = asyncio.Event()

    async def taken(request: Request) -> None:  # takes it on, then never answers
        channel = request_relay.answer_channel(str(request["relay"]))
        await redis.publish(channel, request_relay.TAKEN)
        await released.wait()

    owner.manager.serve_requests(request_relay.OP, taken)
    try:
        async with started_on(owner, other) as (device, _, session_id):
            async with AsyncOpenAI(
                api_key=KEY, base_url=f"{other.http_url}/v1", max_retries=0
            ) as client:
                started = time.monotonic()
                with pytest.raises(openai.InternalServerError) as refused:
                    await client.live.sessions.hangup(session_id)
                waited = time.monotonic() - started
            assert refused.value.status_code == 503
            assert refused.value.code == "owner_unavailable"
            assert waited < 5.0
            await device.session.close()  # it went on
            assert (await until(device, "session.closed")).reason == "close_requested"
    finally:
        released.set()
    await no_live_sessions(owner)
