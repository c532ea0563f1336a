"""Signaling: keys and ephemeral secrets, the multipart offer, hang-up, dead peers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from loadtest.webrtc_client import Caller
from realtime.auth import Authenticator, AuthError
from realtime.transports.webrtc.call_options import CallOptions
from sessions.config import SessionConfig
from web.app import Services

from .apps import fake_app

KEY = "sk-test-parley"


def test_secrets_carry_settings_and_expire() -> None:
    auth = Authenticator(KEY)
    value, expires_at = auth.mint({"instructions": "Be brief."}, ttl_s=10)
    grant = auth.check(f"Bearer {value}")
    assert grant.kind == "secret" and grant.session == {"instructions": "Be brief."}
    assert auth.check(f"Bearer {KEY}").kind == "api_key"
    with pytest.raises(AuthError, match="wrong API key"):
        auth.check("Bearer nope")
    with pytest.raises(AuthError):
        Authenticator("another-key").check(f"Bearer {value}")  # not valid elsewhere
    tampered = value[:-3] + ("AAA" if not value.endswith("AAA") else "BBB")
    with pytest.raises(AuthError, match="not valid"):
        auth.check(f"Bearer {tampered}")
    with pytest.raises(ValueError, match="between 10 and 7200"):
        auth.mint({}, ttl_s=5)
    assert Authenticator(None).check(None).kind == "open"


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(tmp_path, redis_url, api_key=KEY) as running:
        yield running


async def test_a_secret_starts_a_call_with_its_settings(http: httpx.AsyncClient) -> None:
    assert (await http.post("/v1/realtime/client_secrets", json={})).status_code == 401
    minted = await http.post(
        "/v1/realtime/client_secrets",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "expires_after": {"anchor": "created_at", "seconds": 60},
            "session": {
                "type": "realtime",
                "instructions": "Speak like a pirate.",
                "parley": {"extra_events": True},  # session.closed is Parley's own
            },
        },
    )
    assert minted.status_code == 200, minted.text
    body = minted.json()
    assert (
        body["value"].startswith("ek_")
        and body["session"]["instructions"] == "Speak like a pirate."
    )
    caller = Caller(http)
    try:
        refused = await caller.connect({"Authorization": "Bearer wrong"})
        assert refused.status_code == 401
    finally:
        await caller.close()
    caller = Caller(http)
    try:
        response = await caller.connect({"Authorization": f"Bearer {body['value']}"})
        assert response.status_code == 201, response.text
        created = await caller.wait_for(lambda e: e["type"] == "session.created")
        assert created["session"]["instructions"] == "Speak like a pirate."
        hangup = await http.post(
            f"/v1/realtime/calls/{caller.call_id}/hangup",
            headers={"Authorization": f"Bearer {body['value']}"},
        )
        assert hangup.status_code == 200
        closed = await caller.wait_for(lambda e: e["type"] == "session.closed")
        assert closed["reason"] == "hangup"
        again = await http.post(
            f"/v1/realtime/calls/{caller.call_id}/hangup",
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert again.status_code == 404
    finally:
        await caller.close()


async def test_the_sdk_multipart_form_is_accepted(http: httpx.AsyncClient) -> None:
    caller = Caller(http)
    try:
        caller.pc.addTrack(caller.mic)
        await caller.pc.setLocalDescription(await caller.pc.createOffer())
        response = await http.post(
            "/v1/realtime/calls",
            headers={"Authorization": f"Bearer {KEY}"},
            files={
                "sdp": (None, caller.pc.localDescription.sdp),
                "session": (None, json.dumps({"type": "realtime", "instructions": "Hi."})),
            },
        )
        assert response.status_code == 201, response.text
        assert response.text.startswith("v=0")
        call_id = response.headers["location"].rsplit("/", 1)[1]
        await http.post(
            f"/v1/realtime/calls/{call_id}/hangup", headers={"Authorization": f"Bearer {KEY}"}
        )
    finally:
        await caller.close()


async def test_a_peer_that_never_connects_is_closed(
    http: httpx.AsyncClient, app: Starlette
) -> None:
    services: Services = app.state.services
    assert services.calls is not None and services.manager is not None
    caller = Caller(http)
    try:
        caller.pc.addTrack(caller.mic)
        await caller.pc.setLocalDescription(await caller.pc.createOffer())
        call, _answer = await services.calls.create(
            caller.pc.localDescription.sdp.encode(),
            SessionConfig(),
            CallOptions(connect_timeout_s=0.5),
        )
        # The answer is never applied: the peer never connects.
        async with asyncio.timeout(5):
            while len(services.calls):
                await asyncio.sleep(0.05)
        assert call.close_reason == "peer never connected"
        assert len(services.manager) == 0
    finally:
        await caller.close()
