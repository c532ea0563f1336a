"""GPT-Live over SIP, as a GPT-Live app drives it: `parley serve --sip-port --sip-webhook
--sip-api live`; sipp dials, the app's webhook endpoint (a real HTTP server) verifies the
signed `live.transport.incoming` with the official openai SDK and decides with the SDK's
`client.live.sessions.accept|reject|refer|hangup`; the accepted call is a GPT-Live session
whose sideband (`client.live.sideband.connect`) reads its transcripts while the caller's
spoken question (espeak-ng, mu-law RTP) is answered with audio over RTP."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from openai.types.webhooks import LiveTransportIncomingWebhookEvent
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from loadtest.speech import silence, speak, trim_silence
from realtime.transports.sip.media_call import SipMediaCall
from realtime.transports.sip.webhook import new_secret

from ..apps import ServedApp
from ..openai_sip_receiver import Delivery
from .support import SCENARIOS, free_udp_port, requires_sipp
from .test_media_sipp import mulaw_wav
from .test_serve_sip import webhook_sip_app

pytestmark = [requires_sipp, pytest.mark.slow]

API_KEY = "sk-parley-live-sip-test"
SECRET = new_secret()
SESSION: Any = {"type": "live", "model": "gpt-live-1", "instructions": "Answer in a few words."}

Decide = Callable[[openai.AsyncOpenAI, str], Awaitable[None]]


def question_then_wait_for_bye(tmp: Path) -> Path:
    """sipp's `hangup` scenario (the callee hangs up) with a spoken question first."""
    question = np.concatenate(
        [trim_silence(speak("What is the capital of France?", rate=8000)), silence(800, 8000)]
    )
    (tmp / "question.wav").write_bytes(mulaw_wav(question))
    text = (SCENARIOS / "hangup.xml").read_text()
    media = '<nop><action><exec rtp_stream="question.wav,1,0"/></action></nop>\n  '
    text = text.replace(
        '<recv request="BYE" timeout="15000"/>', f'{media}<recv request="BYE" timeout="25000"/>'
    )
    path = tmp / "live_question.xml"
    path.write_text(text)
    return path


def caller_hangs_up(tmp: Path) -> Path:
    """sipp's `call` scenario, the caller's BYE a moment after the answer."""
    text = (SCENARIOS / "call.xml").read_text().replace('"200"/>', '"1500"/>', 1)
    text = text.replace('<pause milliseconds="200"/>', '<pause milliseconds="1500"/>')
    path = tmp / "live_caller_bye.xml"
    path.write_text(text)
    return path


def turned_away(tmp: Path, status: int) -> Path:
    """sipp's `reject_486` scenario expecting `status` instead."""
    text = (
        (SCENARIOS / "reject_486.xml").read_text().replace('response="486"', f'response="{status}"')
    )
    path = tmp / f"live_turned_away_{status}.xml"
    path.write_text(text)
    return path


async def dial(app: ServedApp, tmp: Path, scenario: Path) -> asyncio.subprocess.Process:
    port = app.services.settings.sip_port
    return await asyncio.create_subprocess_exec(
        *["sipp", f"127.0.0.1:{port}", "-sf", str(scenario), "-i", "127.0.0.1"],
        *["-p", str(free_udp_port()), "-mp", str(free_udp_port()), "-m", "1", "-nostdin"],
        *["-timeout", "30s", "-timeout_error"],
        cwd=tmp,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def finished(sipp: asyncio.subprocess.Process) -> None:
    _, stderr = await asyncio.wait_for(sipp.communicate(), 30)
    assert sipp.returncode == 0, stderr.decode(errors="replace")


class LiveApp:
    """Parley serving GPT-Live SIP calls, an app's webhook endpoint, and the app's SDK."""

    def __init__(self, app: ServedApp, sdk: openai.AsyncOpenAI) -> None:
        self.app = app
        self.sdk = sdk
        self.session_id: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_call(self, decide: Decide) -> Callable[[Delivery], Awaitable[None]]:
        async def handler(delivery: Delivery) -> None:
            event = self.sdk.webhooks.unwrap(delivery.body, delivery.headers, secret=SECRET)
            assert isinstance(event, LiveTransportIncomingWebhookEvent)
            assert event.data.type == "sip" and event.data.session_id.startswith("live_")
            assert "Call-ID" in [h.name for h in event.data.sip_headers]
            self.session_id.set_result(event.data.session_id)
            await decide(self.sdk, event.data.session_id)

        return handler

    async def the_call(self, session_id: str) -> SipMediaCall:
        running = self.app.services.running
        assert running is not None and running.sip is not None
        async with asyncio.timeout(10):
            while self.app.services.live_sessions.get(session_id) is None:
                await asyncio.sleep(0.01)
        return running.sip.get(session_id)

    async def all_gone(self) -> None:
        running = self.app.services.running
        assert running is not None and running.sip is not None
        async with asyncio.timeout(5):
            while len(running.sip) or len(running.manager) or len(self.app.services.live_sessions):
                await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def live_app(tmp: Path, redis_url: str, decide: Decide) -> AsyncIterator[LiveApp]:
    async with contextlib.AsyncExitStack() as stack:
        app, receiver = await stack.enter_async_context(
            webhook_sip_app(tmp, redis_url, API_KEY, SECRET, sip_api="live")
        )
        sdk = openai.AsyncOpenAI(api_key=API_KEY, base_url=f"{app.http_url}/v1", max_retries=0)
        stack.push_async_callback(sdk.close)
        live = LiveApp(app, sdk)
        receiver.handler = live.on_call(decide)
        yield live


async def until(conn: Any, kind: str, seen: list[Any], timeout_s: float = 20) -> Any:
    async with asyncio.timeout(timeout_s):
        while (event := await conn.recv()).type != kind:
            seen.append(event)
    seen.append(event)
    return event


async def accept(sdk: openai.AsyncOpenAI, session_id: str) -> None:
    await sdk.live.sessions.accept(session_id, session=SESSION)


async def test_a_question_is_answered_and_the_app_hangs_up(tmp_path: Path, redis_url: str) -> None:
    async with live_app(tmp_path, redis_url, accept) as live:
        sipp = await dial(live.app, tmp_path, question_then_wait_for_bye(tmp_path))
        session_id = await asyncio.wait_for(live.session_id, 10)
        call = await live.the_call(session_id)
        assert call.session is not None and call.session.session_id == session_id
        with pytest.raises(openai.ConflictError) as twice:
            await accept(live.sdk, session_id)
        assert twice.value.code == "session_already_accepted"
        seen: list[Any] = []
        async with live.sdk.live.sideband.connect(session_id=session_id) as sideband:
            heard = await until(sideband, "session.input_transcript.delta", seen)
            assert heard.delta.strip()
            said = await until(sideband, "session.output_transcript.delta", seen)
            assert said.delta
            async with asyncio.timeout(15):
                while call.rtp.audible_packets < 25:  # the answer, spoken over RTP
                    await asyncio.sleep(0.05)
            await live.sdk.live.sessions.hangup(session_id)
            closed = await until(sideband, "session.closed", seen)
        assert closed.reason == "close_requested"
        assert closed.session.id == session_id and closed.session.audio is None
        await finished(sipp)  # it got the BYE
        await live.all_gone()
        with pytest.raises(openai.NotFoundError):
            await live.sdk.live.sessions.hangup(session_id)


async def test_the_caller_hangs_up(tmp_path: Path, redis_url: str) -> None:
    async with live_app(tmp_path, redis_url, accept) as live:
        sipp = await dial(live.app, tmp_path, caller_hangs_up(tmp_path))
        session_id = await asyncio.wait_for(live.session_id, 10)
        await live.the_call(session_id)
        async with live.sdk.live.sideband.connect(session_id=session_id) as sideband:
            closed = await until(sideband, "session.closed", [])
        assert closed.reason == "remote_hangup"
        await finished(sipp)
        await live.all_gone()


async def test_a_bad_config_is_refused_and_the_call_can_still_be_rejected(
    tmp_path: Path, redis_url: str
) -> None:
    refusals: list[openai.BadRequestError] = []

    async def decide(sdk: openai.AsyncOpenAI, session_id: str) -> None:
        bad_sessions: list[Any] = [
            {**SESSION, "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}},
            {**SESSION, "type": "realtime"},
            {**SESSION, "voice": "marin"},
        ]
        for bad in bad_sessions:
            with pytest.raises(openai.BadRequestError) as refused:
                await sdk.live.sessions.accept(session_id, session=bad)
            refusals.append(refused.value)
        with pytest.raises(openai.BadRequestError):
            await sdk.live.sessions.reject(session_id, status_code=200)
        await sdk.live.sessions.reject(session_id, status_code=486)

    async with live_app(tmp_path, redis_url, decide) as live:
        await finished(await dial(live.app, tmp_path, turned_away(tmp_path, 486)))
        await live.all_gone()
    params = [(r.code, r.param) for r in refusals]
    assert params == [
        ("unknown_parameter", "session.audio.format"),
        ("invalid_value", "session.type"),
        ("unknown_parameter", "session.voice"),
    ]
    assert all(r.message for r in refusals)


async def test_refer_redirects_the_ringing_call(tmp_path: Path, redis_url: str) -> None:
    async def refer(sdk: openai.AsyncOpenAI, session_id: str) -> None:
        await sdk.live.sessions.refer(session_id, target_uri="tel:+14155550123")

    async with live_app(tmp_path, redis_url, refer) as live:
        await finished(await dial(live.app, tmp_path, turned_away(tmp_path, 302)))
        await live.all_gone()
        with pytest.raises(openai.NotFoundError) as unknown:
            await live.sdk.live.sessions.accept("live_nope", session=SESSION)
        assert unknown.value.code == "session_not_found"


async def test_an_answered_call_is_transferred_or_goes_on_when_the_transfer_is_refused(
    tmp_path: Path, redis_url: str
) -> None:
    """`client.live.sessions.refer` on an answered call: a REFER in its dialog. Taken on and
        answered by the target, the session ends `close_requested` (Parley's BYE); refused by
        the caller's side (603), the app hears why (502) and the call goes on until its BYE. An
    OpenAI Realtime sideband on the call is refused, naming GPT-Live's."""
    async with live_app(tmp_path, redis_url, accept) as live:
        sipp = await dial(live.app, tmp_path, SCENARIOS / "refer.xml")
        session_id = await asyncio.wait_for(live.session_id, 10)
        await live.the_call(session_id)
        async with live.sdk.live.sideband.connect(session_id=session_id) as sideband:
            await live.sdk.live.sessions.refer(session_id, target_uri="sip:desk@192.0.2.9")
            closed = await until(sideband, "session.closed", [])
        assert closed.reason == "close_requested"
        await finished(sipp)
        await live.all_gone()

        live.session_id = asyncio.get_running_loop().create_future()
        sipp = await dial(live.app, tmp_path, SCENARIOS / "refer_refused.xml")
        session_id = await asyncio.wait_for(live.session_id, 10)
        await live.the_call(session_id)
        realtime = f"{live.app.ws_url}/v1/realtime?call_id={session_id}"
        with pytest.raises(InvalidStatus) as wrong_api:  # a Realtime sideband would hear nothing
            async with connect(realtime, additional_headers={"Authorization": f"Bearer {API_KEY}"}):
                pass
        assert wrong_api.value.response.status_code == 409
        assert f"/v1/live/sessions/{session_id}/attach" in wrong_api.value.response.body.decode()
        async with live.sdk.live.sideband.connect(session_id=session_id) as sideband:
            with pytest.raises(openai.APIStatusError) as refused:
                await live.sdk.live.sessions.refer(session_id, target_uri="sip:desk@192.0.2.9")
            assert refused.value.status_code == 502
            assert refused.value.code == "refer_failed"
            assert "SIP 603" in refused.value.message
            closed = await until(sideband, "session.closed", [])
        assert closed.reason == "remote_hangup"  # the caller's own BYE, a second later
        await finished(sipp)
        await live.all_gone()
