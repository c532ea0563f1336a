"""SIP call control that lands on another worker than the call: two apps (two server
processes, as `--workers 2` makes them) on one Redis, app A serving SIP and app B none; the
app's webhook handler decides through the official SDK pointed at B, and B relays each
request to A (web/call_controls.py, realtime/request_relay.py), whose answer it gives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis
from openai.types.webhooks import (
    LiveTransportIncomingWebhookEvent,
    RealtimeCallIncomingWebhookEvent,
)

from realtime import request_relay
from realtime.call_index import call_key
from realtime.transports.sip.webhook import new_secret
from sessions.process_beat import Request
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.openai_sip_receiver import Delivery
from tests.realtime.sip.support import SCENARIOS, requires_sipp
from tests.realtime.sip.test_live_sip import SESSION, caller_hangs_up, finished, turned_away
from tests.realtime.sip.test_serve_sip import all_gone, dial, webhook_sip_app
from web.settings import Settings

API_KEY = "sk-parley-call-controls-test"
SECRET = new_secret()
AUTH = {"Authorization": f"Bearer {API_KEY}"}

Decide = Callable[[openai.AsyncOpenAI, str], Awaitable[None]]


class Workers:
    """A serves SIP (its webhook goes to the app), B serves none; `via_b`: the app's SDK on B."""

    def __init__(self, a: ServedApp, b: ServedApp, via_b: openai.AsyncOpenAI) -> None:
        self.a, self.b, self.via_b = a, b, via_b
        self.call_id: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.decide: Decide | None = None

    async def on_call(self, delivery: Delivery) -> None:
        event = self.via_b.webhooks.unwrap(delivery.body, delivery.headers, secret=SECRET)
        if isinstance(event, RealtimeCallIncomingWebhookEvent):
            call_id = event.data.call_id
        else:
            assert isinstance(event, LiveTransportIncomingWebhookEvent)
            call_id = event.data.session_id
        self.call_id.set_result(call_id)
        if self.decide is not None:
            await self.decide(self.via_b, call_id)


@contextlib.asynccontextmanager
async def workers(tmp: Path, redis_url: str, **sip: Any) -> AsyncIterator[Workers]:
    async with contextlib.AsyncExitStack() as stack:
        a, receiver = await stack.enter_async_context(
            webhook_sip_app(tmp, redis_url, API_KEY, SECRET, **sip)
        )
        settings = Settings(pipeline=fake_graph_file(tmp), api_key=API_KEY)
        b = await stack.enter_async_context(served_app(settings, redis_url))
        assert b.services.running is not None and b.services.running.sip is None
        via_b = openai.AsyncOpenAI(api_key=API_KEY, base_url=f"{b.http_url}/v1", max_retries=0)
        stack.push_async_callback(via_b.close)
        both = Workers(a, b, via_b)
        receiver.handler = both.on_call
        yield both


@requires_sipp
@pytest.mark.slow
async def test_a_realtime_call_is_accepted_through_another_worker(
    tmp_path: Path, redis_url: str
) -> None:
    """The accept goes to B from inside the webhook handler (before the webhook's own
    answer), B relays it to A, and the call is answered; a bad decision first gets A's own
    400, byte for byte."""
    refusals: list[httpx.Response] = []

    async def accept(via_b: openai.AsyncOpenAI, call_id: str) -> None:
        for url in (both.a.http_url, both.b.http_url):  # A's answer, and B's relayed one
            async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
                path = f"/v1/realtime/calls/{call_id}/reject"
                refusals.append(await http.post(path, json={"status_code": 200}))
        await via_b.realtime.calls.accept(call_id, type="realtime", instructions="Be brief.")

    async with workers(tmp_path, redis_url) as both:
        both.decide = accept
        sipp = await dial(both.a, tmp_path, caller_hangs_up(tmp_path))
        await finished(sipp)  # answered, then its BYE
        await all_gone(both.a)
    on_a, via_b = refusals
    assert via_b.status_code == on_a.status_code == 400
    assert via_b.headers["content-type"] == on_a.headers["content-type"]
    assert via_b.content == on_a.content
    assert on_a.json()["error"]["param"] == "status_code"


@requires_sipp
@pytest.mark.slow
async def test_a_realtime_call_is_rejected_through_another_worker(
    tmp_path: Path, redis_url: str
) -> None:
    async def reject(via_b: openai.AsyncOpenAI, call_id: str) -> None:
        await via_b.realtime.calls.reject(call_id, status_code=486)

    async with workers(tmp_path, redis_url) as both:
        both.decide = reject
        await finished(await dial(both.a, tmp_path, turned_away(tmp_path, 486)))
        await all_gone(both.a)
        call_id = both.call_id.result()
        with pytest.raises(openai.NotFoundError) as decided:  # no longer ringing anywhere
            await both.via_b.realtime.calls.accept(call_id, type="realtime")
        assert decided.value.code == "call_id_not_found"


@requires_sipp
@pytest.mark.slow
async def test_a_live_call_is_accepted_then_transferred_through_another_worker(
    tmp_path: Path, redis_url: str
) -> None:
    """GPT-Live: `live.sessions.accept` through B, then `live.sessions.refer` of the
    answered call through B: A sends the REFER (sipp checks its Refer-To) and hangs up
    once the target answered."""

    async def accept(via_b: openai.AsyncOpenAI, session_id: str) -> None:
        await via_b.live.sessions.accept(session_id, session=SESSION)

    async with workers(tmp_path, redis_url, sip_api="live") as both:
        both.decide = accept
        sipp = await dial(both.a, tmp_path, SCENARIOS / "refer.xml")
        session_id = await asyncio.wait_for(both.call_id, 10)
        async with asyncio.timeout(10):
            while both.a.services.live_sessions.get(session_id) is None:
                await asyncio.sleep(0.01)
        with pytest.raises(openai.ConflictError) as twice:  # A's 409, through B
            await both.via_b.live.sessions.accept(session_id, session=SESSION)
        assert twice.value.code == "session_already_accepted"
        await both.via_b.live.sessions.refer(session_id, target_uri="sip:desk@192.0.2.9")
        await finished(sipp)  # the REFER to sip:desk@192.0.2.9, the NOTIFYs, A's BYE
        await all_gone(both.a)


@requires_sipp
@pytest.mark.slow
async def test_a_ringing_live_call_is_hung_up_through_another_worker(
    tmp_path: Path, redis_url: str
) -> None:
    async def hang_up(via_b: openai.AsyncOpenAI, session_id: str) -> None:
        await via_b.live.sessions.hangup(session_id)

    async with workers(tmp_path, redis_url, sip_api="live") as both:
        both.decide = hang_up
        await finished(await dial(both.a, tmp_path, turned_away(tmp_path, 603)))
        await all_gone(both.a)


async def test_an_unknown_id_is_not_found_through_a_worker_without_sip(
    tmp_path: Path, redis_url: str
) -> None:
    settings = Settings(pipeline=fake_graph_file(tmp_path), api_key=API_KEY)
    async with (
        served_app(settings, redis_url) as b,
        openai.AsyncOpenAI(api_key=API_KEY, base_url=f"{b.http_url}/v1", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.NotFoundError) as call:
            await sdk.realtime.calls.accept("rtc_nope", type="realtime")
        with pytest.raises(openai.NotFoundError) as refer:
            await sdk.realtime.calls.refer("rtc_nope", target_uri="tel:+14155550123")
        with pytest.raises(openai.NotFoundError) as live:
            await sdk.live.sessions.accept("live_nope", session=SESSION)
    assert call.value.code == refer.value.code == "call_id_not_found"
    assert live.value.code == "session_not_found"


async def test_an_owner_that_does_not_take_the_request_is_a_503(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call index names A for a call, but A is silent: B answers 503 at once."""
    monkeypatch.setattr(request_relay, "TAKEN_S", 0.3)
    settings = Settings(pipeline=fake_graph_file(tmp_path), api_key=API_KEY)
    released = asyncio.Event()

    async def stalled(request: Request) -> None:  # alive, but it never takes it on
        await released.wait()

    async with (
        served_app(settings, redis_url) as a,
        served_app(settings, redis_url) as b,
        openai.AsyncOpenAI(api_key=API_KEY, base_url=f"{b.http_url}/v1", max_retries=0) as sdk,
    ):
        a.manager.serve_requests(request_relay.OP, stalled)
        redis = aioredis.Redis.from_url(redis_url)
        try:
            await redis.set(call_key("rtc_ringing"), a.manager.process_id, ex=30)
            with pytest.raises(openai.InternalServerError) as refused:
                await sdk.realtime.calls.accept("rtc_ringing", type="realtime")
        finally:
            released.set()
            await redis.delete(call_key("rtc_ringing"))
            await redis.aclose()
    assert refused.value.status_code == 503
    assert refused.value.code == "owner_unavailable"
