"""`parley serve --sip-port` as a whole: the app's lifespan runs the user agent server, the
calls' media and sessions; sipp dials it. Without a webhook a call is answered at once and
talks back; with `--sip-webhook` the app hears of the call first (a signed
`realtime.call.incoming`, checked with the official openai SDK), accepts it with its own
session settings through `POST /v1/realtime/calls/{call_id}/accept`, and watches the call
over a sideband WebSocket (`/v1/realtime?call_id=`), which sees the call's events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.webhooks import RealtimeCallIncomingWebhookEvent
from websockets.asyncio.client import connect

from realtime.transports.sip.media_call import SipMediaCall
from realtime.transports.sip.webhook import new_secret
from web.settings import Settings

from ..apps import ServedApp, fake_graph_file, served_app
from ..openai_sip_receiver import Delivery, Receiver, webhook_receiver
from .support import SCENARIOS, free_sipp_port, free_udp_port, requires_sipp
from .test_media_sipp import scenario

pytestmark = [requires_sipp, pytest.mark.slow]

API_KEY = "sk-parley-sip-test"
SECRET = new_secret()
INSTRUCTIONS = "You answer the phone for Example Dental."


async def dial(app: ServedApp, tmp: Path, script: Path | None = None) -> asyncio.subprocess.Process:
    """sipp calls the app's SIP port: `script`, else a question, a wait for the answer, key
    5, BYE."""
    port = app.services.settings.sip_port
    script = script or scenario(tmp)
    return await asyncio.create_subprocess_exec(
        *["sipp", f"127.0.0.1:{port}", "-sf", str(script), "-i", "127.0.0.1"],
        *["-p", str(free_udp_port()), "-mp", str(free_udp_port()), "-m", "1", "-nostdin"],
        *["-timeout", "30s", "-timeout_error"],
        cwd=tmp,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def the_call(app: ServedApp) -> SipMediaCall:
    running = app.services.running
    assert running is not None and running.sip is not None
    async with asyncio.timeout(10):
        while not len(running.sip):
            await asyncio.sleep(0.01)
    (call_id,) = running.sip.call_ids()
    return running.sip.get(call_id)


async def all_gone(app: ServedApp) -> None:
    """Every SIP call and session of the app has ended (within 5 s)."""
    running = app.services.running
    assert running is not None and running.sip is not None
    async with asyncio.timeout(5):
        while len(running.sip) or len(running.manager):
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def sip_app(tmp: Path, redis_url: str, **settings: Any) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp)
    chosen = Settings(pipeline=graph, sip_port=free_sipp_port(), **settings)
    async with served_app(chosen, redis_url) as app:
        yield app


@contextlib.asynccontextmanager
async def webhook_sip_app(
    tmp: Path, redis_url: str, key: str, secret: str, **settings: Any
) -> AsyncIterator[tuple[ServedApp, Receiver]]:
    """`sip_app` announcing its calls to an app's webhook endpoint (a real HTTP server, its
    handler the test's to set) signed with `secret`; the API key is `key`."""
    async with (
        webhook_receiver() as receiver,
        sip_app(
            tmp,
            redis_url,
            api_key=key,
            sip_webhook=receiver.url,
            sip_webhook_secret=secret,
            **settings,
        ) as app,
    ):
        yield app, receiver


@contextlib.asynccontextmanager
async def accepting_app(
    tmp: Path, redis_url: str, accepted: asyncio.Future[str], **session: Any
) -> AsyncIterator[tuple[ServedApp, openai.AsyncOpenAI]]:
    """Parley with OpenAI's SIP flow, and an app whose webhook handler verifies each call
    with the SDK and accepts it with `session` (then sets `accepted` to the call's id)."""
    async with contextlib.AsyncExitStack() as stack:
        app, receiver = await stack.enter_async_context(
            webhook_sip_app(tmp, redis_url, API_KEY, SECRET)
        )
        sdk = openai.AsyncOpenAI(api_key=API_KEY, base_url=f"{app.http_url}/v1", max_retries=0)
        stack.push_async_callback(sdk.close)

        async def on_call(delivery: Delivery) -> None:
            event = sdk.webhooks.unwrap(delivery.body, delivery.headers, secret=SECRET)
            assert isinstance(event, RealtimeCallIncomingWebhookEvent)
            await sdk.realtime.calls.accept(event.data.call_id, type="realtime", **session)
            accepted.set_result(event.data.call_id)

        receiver.handler = on_call
        yield app, sdk


async def test_a_call_is_answered_and_talks_back(tmp_path: Path, redis_url: str) -> None:
    async with sip_app(tmp_path, redis_url) as app:
        sipp = await dial(app, tmp_path)
        call = await the_call(app)
        _, stderr = await sipp.communicate()
        assert sipp.returncode == 0, stderr.decode(errors="replace")
        assert call.rtp.audible_packets > 25  # the answer, as audio
        await all_gone(app)


async def test_the_app_accepts_the_call_and_watches_it_over_a_sideband(
    tmp_path: Path, redis_url: str
) -> None:
    accepted: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    accepting = accepting_app(tmp_path, redis_url, accepted, instructions=INSTRUCTIONS)
    async with accepting as (app, _sdk):
        sipp = await dial(app, tmp_path)
        call_id = await asyncio.wait_for(accepted, 10)
        call = await the_call(app)
        assert call.session is not None and call.session.config.instructions == INSTRUCTIONS
        seen: list[str] = []
        url = f"{app.ws_url}/v1/realtime?call_id={call_id}"
        async with connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
            async with asyncio.timeout(20):
                async for message in ws:
                    seen.append(json.loads(message)["type"])
                    if seen[-1] == "response.done":
                        break
        for expected in (
            "input_audio_buffer.speech_started",
            "conversation.item.input_audio_transcription.completed",
            "response.created",
        ):
            assert expected in seen, (expected, seen)
        _, stderr = await sipp.communicate()
        assert sipp.returncode == 0, stderr.decode(errors="replace")


async def test_the_app_transfers_an_answered_call(tmp_path: Path, redis_url: str) -> None:
    """OpenAI's refer of an active call (`client.realtime.calls.refer`, sent the moment the
    accept returns): a REFER in the call's dialog; once the caller's side reports the target
    answered, Parley hangs up."""
    accepted: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    async with accepting_app(tmp_path, redis_url, accepted) as (app, sdk):
        sipp = await dial(app, tmp_path, SCENARIOS / "refer.xml")
        call_id = await asyncio.wait_for(accepted, 10)
        # at once, as the accept returns: the REFER goes once the call is answered and up
        await sdk.realtime.calls.refer(call_id, target_uri="sip:desk@192.0.2.9")
        _, stderr = await asyncio.wait_for(sipp.communicate(), 30)
        assert sipp.returncode == 0, stderr.decode(errors="replace")  # the NOTIFYs, our BYE
        await all_gone(app)
        with pytest.raises(openai.NotFoundError):
            await sdk.realtime.calls.refer(call_id, target_uri="sip:desk@192.0.2.9")
