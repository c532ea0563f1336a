"""Per-key limits end to end: a real uvicorn server on a real Redis, two API keys, raw
WebSocket clients. A key over its limits is refused before the upgrade with 429
`rate_limit_exceeded` while the other key gets in; a slot frees when a session ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime.auth import address_caller, key_caller
from sessions.key_limits import KeyLimits
from sessions.keys import caller_keys
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from tests.realtime.twilio_caller import TwilioCaller
from web.settings import Settings, SettingsError, parse_settings

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"


@contextlib.asynccontextmanager
async def session(
    server: ServedApp, key: str | None, query: str = "", **kwargs: Any
) -> AsyncIterator[RecordingClient]:
    """A raw OpenAI Realtime WebSocket with its session created."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{server.ws_url}/v1/realtime?model=parley{'&' + query if query else ''}"
    async with connect(url, additional_headers=headers, proxy=None, **kwargs) as ws:
        client = RecordingClient(ws)
        await client.wait_type("session.created")
        yield client


async def refused(server: ServedApp, key: str | None, **kwargs: Any) -> InvalidStatus:
    with pytest.raises(InvalidStatus) as refusal:
        async with session(server, key, **kwargs):
            pass
    return refusal.value


def error_of(refusal: InvalidStatus) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(refusal.response.body or b"{}")["error"]
    return body


async def settled(check: Any, within_s: float = 5.0) -> None:
    async with asyncio.timeout(within_s):
        while not await check():
            await asyncio.sleep(0.05)


@pytest.fixture
def graph(tmp_path: Path) -> str:
    return fake_graph_file(tmp_path, "audio_ms: 600")


async def test_a_key_over_its_session_limit_is_refused_while_another_gets_in(
    graph: str, redis_url: str
) -> None:
    settings = Settings(
        pipeline=graph, api_key=f"{KEY_A}, {KEY_B}", max_sessions=8, max_sessions_per_key=2
    )
    async with served_app(settings, redis_url) as server:
        manager = server.services.manager
        assert manager is not None
        tenant_a = key_caller(KEY_A)
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            minted = await http.post(
                "/v1/realtime/client_secrets",
                headers={"Authorization": f"Bearer {KEY_A}"},
                json={"session": {"type": "realtime"}},
            )
        secret_a = minted.json()["value"]
        async with session(server, KEY_A) as first, session(server, secret_a):
            # two of tenant A's: a third is refused, by key or by a secret A minted
            for key in (KEY_A, secret_a):
                refusal = await refused(server, key)
                assert refusal.response.status_code == 429
                error = error_of(refusal)
                assert error["code"] == "rate_limit_exceeded", error
                assert "holds 2 sessions" in error["message"]
                assert "Retry-After" not in refusal.response.headers
            # tenant B has its own limit
            async with session(server, KEY_B), session(server, KEY_B):
                assert len(manager) == 4
                assert await manager.key_limits.count(key_caller(KEY_B)) == 2
            # a resume is no new session: its key's limit does not refuse the upgrade
            url = f"{server.ws_url}/v1/realtime?session_id=sess_nope&resume_token=x"
            headers = {"Authorization": f"Bearer {KEY_A}"}
            async with connect(url, additional_headers=headers, proxy=None) as ws:
                gone = await RecordingClient(ws).wait_type("error")
                assert gone["error"]["code"] == "session_not_found"
            await first.ws.close()
            await settled(lambda: _count(manager.key_limits.count(tenant_a), 1))
            async with session(server, KEY_A):  # the slot freed when the session ended
                assert await manager.key_limits.count(tenant_a) == 2
        await settled(lambda: _count(manager.key_limits.count(tenant_a), 0))
        metrics = server.services.metrics.registry
        assert metrics.get_sample_value("parley_key_limit_rejections_total") == 2


async def _count(count: Any, expected: int) -> bool:
    return bool(await count == expected)


async def test_the_rate_limit_refuses_a_burst_with_retry_after(
    graph: str, redis_url: str, redis: aioredis.Redis
) -> None:
    settings = Settings(pipeline=graph, api_key=f"{KEY_A},{KEY_B}", sessions_per_minute_per_key=3)
    async with served_app(settings, redis_url) as server:
        for _ in range(3):  # three at once, then one every 20 s
            async with session(server, KEY_A):
                pass
        refusal = await refused(server, KEY_A)
        assert refusal.response.status_code == 429
        assert error_of(refusal)["code"] == "rate_limit_exceeded"
        assert 15 <= int(refusal.response.headers["Retry-After"]) <= 20
        # WebRTC's offer is refused the same way, before it is read
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            answer = await http.post(
                "/v1/realtime/calls",
                headers={"Authorization": f"Bearer {KEY_A}", "Content-Type": "application/sdp"},
                content=b"v=0",
            )
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["code"] == "rate_limit_exceeded"
        assert 15 <= int(answer.headers["Retry-After"]) <= 20
        async with session(server, KEY_B):  # another key's bucket is full
            pass
    # the rate state lives until the bucket would be full again (a minute at most)
    rate_keys = [caller_keys(key_caller(key))[1] for key in (KEY_A, KEY_B)]
    assert 0 < await redis.pttl(rate_keys[0]) <= 60_000
    assert await redis.delete(*rate_keys) == 2


async def test_with_no_key_one_address_cannot_take_every_slot(graph: str, redis_url: str) -> None:
    # The server listens on 127.0.0.1; a client can come from any loopback address.
    settings = Settings(pipeline=graph, max_sessions=4, max_sessions_per_key=1)
    async with served_app(settings, redis_url) as server:
        manager = server.services.manager
        assert manager is not None
        async with session(server, None):
            refusal = await refused(server, None)
            assert refusal.response.status_code == 429
            assert error_of(refusal)["code"] == "rate_limit_exceeded"
            async with session(server, None, local_addr=("127.0.0.2", 0)):
                assert await manager.key_limits.count(address_caller("127.0.0.2")) == 1
                assert await manager.key_limits.count(address_caller("127.0.0.1")) == 1


async def test_a_video_stream_over_the_limit_is_told_after_the_upgrade(
    graph: str, redis_url: str
) -> None:
    """Whether a video chat stream starts a session or resumes one says its first message,
    so its key's limit is checked then: an `error` `rate_limit_exceeded`, close 1013."""
    settings = Settings(pipeline=graph, max_sessions=4, max_sessions_per_key=1)
    async with served_app(settings, redis_url) as server, session(server, None):
        url = f"{server.ws_url}/v1/video/chat/stream"
        async with connect(url, proxy=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "parley": {"extras": True}}))
            async with asyncio.timeout(10):
                error = json.loads(await ws.recv())
                assert error["type"] == "error" and error["code"] == "rate_limit_exceeded"
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        await ws.recv()
            assert ws.close_code == 1013


def test_the_per_key_settings_from_flags_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, settings = parse_settings(["serve"])
    assert settings.key_limits == KeyLimits() and not settings.key_limits.enabled
    _, settings = parse_settings(
        ["serve", "--max-sessions-per-key", "4", "--sessions-per-minute-per-key", "30"]
    )
    assert settings.key_limits == KeyLimits(4, 30)
    monkeypatch.setenv("PARLEY_MAX_SESSIONS_PER_KEY", "2")
    monkeypatch.setenv("PARLEY_API_KEY", f"{KEY_A},,{KEY_B}")
    _, settings = parse_settings(["serve"])
    assert settings.key_limits == KeyLimits(2) and settings.api_key == f"{KEY_A},{KEY_B}"
    monkeypatch.setenv("PARLEY_API_KEY", " , ")
    assert parse_settings(["serve"])[1].api_key is None  # no key: loopback only
    for flag in ("--max-sessions-per-key", "--sessions-per-minute-per-key"):
        with pytest.raises(SettingsError, match=f"{flag}: must be between"):
            parse_settings(["serve", flag, "-1" if "minute" in flag else "0"])


async def test_a_twilio_stream_of_a_key_at_its_limit_is_refused(graph: str, redis_url: str) -> None:
    """A token in the query is checked before the upgrade (429); one in `start`'s custom
    parameters only at `start`, where the stream is closed with 1013."""
    settings = Settings(pipeline=graph, api_key=KEY_A, max_sessions=4, max_sessions_per_key=1)
    async with served_app(settings, redis_url) as server, session(server, KEY_A):
        url = f"{server.ws_url}/v1/twilio/media"
        with pytest.raises(InvalidStatus) as refusal:
            async with connect(f"{url}?token={KEY_A}", proxy=None):
                pass
        assert refusal.value.response.status_code == 429
        assert error_of(refusal.value)["code"] == "rate_limit_exceeded"
        async with connect(url, proxy=None) as ws:
            twilio = TwilioCaller(ws)
            try:
                await twilio.connect(token=KEY_A)
                await twilio.closed()
            finally:
                await twilio.aclose()
        assert ws.close_code == 1013
        assert server.services.manager is not None and len(server.services.manager) == 1
