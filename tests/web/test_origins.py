"""Origins: which web pages may open WebSockets and use signaling, and CORS for them.

A real uvicorn on 127.0.0.1 with the echo pipeline; WebSockets from the `websockets` client
with an explicit Origin (as a browser sends it), signaling over httpx, calls from aiortc.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from loadtest.webrtc_client import Caller
from tests.realtime.apps import ServedApp, served_app
from web.origin_names import normalize_origin
from web.origins import OriginAllowlist, OriginPolicy, own_origins
from web.settings import Settings, SettingsError, parse_settings

FOREIGN = "http://evil.example"
KEY = "sk-test-parley-origins"
WEBSOCKETS = ("/v1/realtime", "/v1/video/chat/stream")


async def _open_websocket(
    url: str, origin: str | None, headers: dict[str, str] | None = None
) -> None:
    """Open a WebSocket as a page at `origin` would (None: a non-browser client) and see it
    work: `/v1/realtime` says session.created; the video stream just opens."""
    async with connect(
        url,
        origin=origin,  # type: ignore[arg-type]  # websockets types it as its Origin NewType
        additional_headers=headers,
        open_timeout=10,
    ) as ws:
        if url.endswith("/v1/realtime"):
            async with asyncio.timeout(10):
                first = json.loads(await ws.recv())
            assert first["type"] == "session.created"


async def _refused_websocket(url: str, origin: str) -> dict[str, str]:
    """The error body of a refused upgrade; fails if the upgrade went through."""
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, origin=origin, open_timeout=10):  # type: ignore[arg-type]
            pass
    response = refused.value.response
    assert response.status_code == 403, (url, origin, response.status_code)
    error: dict[str, str] = json.loads(response.body or b"{}")["error"]
    return error


async def _sessions(served: ServedApp) -> int:
    manager = served.services.manager
    assert manager is not None
    return len(manager)


async def test_a_foreign_origin_gets_403_before_either_websocket_upgrades(
    redis_url: str,
) -> None:
    async with served_app(Settings(pipeline="echo"), redis_url, settings_port=True) as served:
        another_local_port = f"http://127.0.0.1:{served.port + 1}"
        for path in WEBSOCKETS:
            for origin in (FOREIGN, another_local_port, "null", "https://127.0.0.1.evil.example"):
                error = await _refused_websocket(f"{served.ws_url}{path}", origin)
                assert error["code"] == "origin_not_allowed"
                assert origin in error["message"] and "--allowed-origins" in error["message"]
        assert await _sessions(served) == 0


async def test_the_servers_own_origin_and_clients_without_one_are_accepted(
    redis_url: str,
) -> None:
    async with served_app(Settings(pipeline="echo"), redis_url, settings_port=True) as served:
        own = [f"http://{host}:{served.port}" for host in ("127.0.0.1", "localhost", "[::1]")]
        for path in WEBSOCKETS:
            for origin in (None, *own):
                await _open_websocket(f"{served.ws_url}{path}", origin)


async def test_with_port_0_the_port_it_listens_on_is_its_own(redis_url: str) -> None:
    async with served_app(
        Settings(pipeline="echo", port=0), redis_url, settings_port=True
    ) as served:
        await _open_websocket(f"{served.ws_url}/v1/realtime", f"http://localhost:{served.port}")
        await _refused_websocket(f"{served.ws_url}/v1/realtime", "http://localhost:8080")


async def test_configured_origins_are_accepted_and_others_still_refused(
    redis_url: str,
) -> None:
    settings = Settings(pipeline="echo", allowed_origins=("https://app.example:3000",))
    async with served_app(settings, redis_url, settings_port=True) as served:
        for path in WEBSOCKETS:
            await _open_websocket(f"{served.ws_url}{path}", "https://app.example:3000")
            await _open_websocket(f"{served.ws_url}{path}", f"http://127.0.0.1:{served.port}")
            for origin in (FOREIGN, "http://app.example:3000", "https://app.example"):
                await _refused_websocket(f"{served.ws_url}{path}", origin)


async def test_any_origin_with_a_key_still_needs_the_key(redis_url: str) -> None:
    settings = Settings(pipeline="echo", api_key=KEY, allowed_origins=("*",))
    async with served_app(settings, redis_url, settings_port=True) as served:
        url = f"{served.ws_url}/v1/realtime"
        await _open_websocket(url, FOREIGN, {"Authorization": f"Bearer {KEY}"})
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url, origin=FOREIGN, open_timeout=10):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 401


async def test_a_foreign_origin_is_refused_on_every_signaling_endpoint(
    redis_url: str,
) -> None:
    async with (
        served_app(Settings(pipeline="echo"), redis_url, settings_port=True) as served,
        httpx.AsyncClient(base_url=served.http_url, timeout=10) as http,
    ):
        caller = Caller(http)
        try:
            refused = await caller.connect({"Origin": FOREIGN})
        finally:
            await caller.close()
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in refused.headers
        for path, body in (
            ("/v1/realtime/calls/rtc_nosuchcall/hangup", None),
            ("/v1/realtime/client_secrets", {}),
        ):
            response = await http.post(path, json=body, headers={"Origin": FOREIGN})
            assert response.status_code == 403, (path, response.text)
            assert "access-control-allow-origin" not in response.headers
            assert (await http.post(path, json=body)).status_code != 403  # no Origin: served
        assert await _sessions(served) == 0


async def test_an_allowed_page_can_call_mint_and_hang_up_across_origins(
    redis_url: str,
) -> None:
    page = "https://app.example"
    settings = Settings(pipeline="echo", allowed_origins=(page,))
    async with (
        served_app(settings, redis_url, settings_port=True) as served,
        httpx.AsyncClient(base_url=served.http_url, timeout=10) as http,
    ):
        minted = await http.post("/v1/realtime/client_secrets", json={}, headers={"Origin": page})
        assert minted.status_code == 200, minted.text
        assert minted.headers["access-control-allow-origin"] == page
        caller = Caller(http)
        try:
            answered = await caller.connect({"Origin": page})
            assert answered.status_code == 201, answered.text
            assert answered.headers["access-control-allow-origin"] == page
            assert "location" in answered.headers["access-control-expose-headers"].lower()
            assert "origin" in answered.headers["vary"].lower()
            await caller.wait_for(lambda e: e["type"] == "session.created")
            # session.closed is Parley's own event: a client opts in to see it
            caller.send({"type": "session.update", "session": {"parley": {"extra_events": True}}})
            await caller.wait_for(lambda e: e["type"] == "session.updated")
            hangup = await http.post(
                f"{answered.headers['location']}/hangup", headers={"Origin": page}
            )
            assert hangup.status_code == 200
            assert hangup.headers["access-control-allow-origin"] == page
            await caller.wait_for(lambda e: e["type"] == "session.closed")
        finally:
            await caller.close()
        async with asyncio.timeout(10):
            while await _sessions(served):
                await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/realtime/calls",
        "/v1/realtime/calls/rtc_anycall/hangup",
        "/v1/realtime/client_secrets",
    ],
)
async def test_preflights_are_answered_for_allowed_origins_only(path: str, redis_url: str) -> None:
    page = "http://localhost:5173"
    asks = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
    }
    settings = Settings(pipeline="echo", allowed_origins=(page,))
    async with (
        served_app(settings, redis_url, settings_port=True) as served,
        httpx.AsyncClient(base_url=served.http_url, timeout=10) as http,
    ):
        for origin in (page, f"http://127.0.0.1:{served.port}"):
            preflight = await http.options(path, headers={"Origin": origin, **asks})
            assert preflight.status_code == 204, preflight.text
            headers = preflight.headers
            assert headers["access-control-allow-origin"] == origin
            assert "POST" in headers["access-control-allow-methods"]
            allowed = {
                h.strip().lower() for h in headers["access-control-allow-headers"].split(",")
            }
            assert {"authorization", "content-type", "x-stainless-os"} <= allowed
            assert int(headers["access-control-max-age"]) > 0
            assert "origin" in headers["vary"].lower()
        foreign = await http.options(path, headers={"Origin": FOREIGN, **asks})
        assert foreign.status_code == 403
        assert not any(name.startswith("access-control-") for name in foreign.headers)


def test_allowed_origins_from_the_option_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, settings = parse_settings(
        ["serve", "--allowed-origins", "HTTP://App.example:3000/, https://x.example:443,"]
    )
    assert settings.allowed_origins == ("http://app.example:3000", "https://x.example")
    monkeypatch.setenv("PARLEY_ALLOWED_ORIGINS", "http://[::1]:5173")
    assert parse_settings(["serve"])[1].allowed_origins == ("http://[::1]:5173",)
    assert parse_settings(["serve", "--api-key", KEY, "--allowed-origins", "*"])[
        1
    ].allowed_origins == ("*",)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("app.example", "not an origin"),
        ("localhost:3000", "not an origin"),
        ("https://app.example/path", "not an origin"),
        ("https://user@app.example", "credentials"),
        ("http://app.example:99999", "port"),
        ("http://[::1", "not an origin"),
        ("*", "needs --api-key"),
    ],
)
def test_a_malformed_origin_is_a_settings_error_naming_the_option(value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message) as error:
        parse_settings(["serve", "--allowed-origins", f"http://ok.example,{value}"])
    assert str(error.value).startswith("--allowed-origins: ")


def test_own_origins_of_a_loopback_or_wildcard_host() -> None:
    assert own_origins("http", "::1", 8080) == {
        "http://[::1]:8080",
        "http://127.0.0.1:8080",
        "http://localhost:8080",
    }
    assert own_origins("http", "0.0.0.0", 8080) == frozenset()
    assert own_origins("https", "parley.example", 443) == {"https://parley.example"}
    assert normalize_origin("http://LOCALHOST:80") == "http://localhost"


async def test_without_denial_responses_a_foreign_websocket_is_closed_with_1008() -> None:
    reached: list[str] = []
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["path"])

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    policy = OriginPolicy(app, OriginAllowlist(frozenset()))
    scope: Scope = {
        "type": "websocket",
        "path": "/v1/realtime",
        "headers": [(b"origin", FOREIGN.encode())],
        "server": ("127.0.0.1", 8080),
        "scheme": "ws",
    }
    await policy(scope, receive, send)
    assert reached == []
    assert sent == [{"type": "websocket.close", "code": 1008, "reason": "origin_not_allowed"}]
