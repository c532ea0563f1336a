"""OpenAI's SIP flow end to end, minus SIP itself: a call reaches `WebhookCallGate`, the
app's webhook endpoint (a real HTTP server) verifies the event with the official openai SDK
and decides with the SDK's `realtime.calls.accept|reject|refer` against Parley's routes, and
the gate hands the SIP side that decision. Also the routes' refusals: 404 for a call that is
not waiting, 400 with an OpenAI-shaped error for a body OpenAI would refuse, 401."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai.types.webhooks import RealtimeCallIncomingWebhookEvent
from starlette.applications import Starlette

from realtime.transports.sip.call_gate import WebhookCallGate
from realtime.transports.sip.handler import IncomingCall, Rejection
from realtime.transports.sip.pending_calls import Accept, PendingCalls, Refer, Reject
from realtime.transports.sip.webhook import WebhookSender, new_secret
from web.app import create_app
from web.realtime_routes import PENDING_CALLS_STATE
from web.settings import Settings

from .openai_sip_receiver import Delivery, Receiver, closed_port_url, serving, webhook_receiver

API_KEY = "sk-parley-test"
SECRET = new_secret()
CALL = IncomingCall(
    call_id="a84b4c76e66710@pc33.example.com",
    source=("127.0.0.1", 5061),
    sdp="v=0\r\n",
    headers=(
        ("From", "<sip:+14155550100@example.com>;tag=1928301774"),
        ("To", "<sip:agent@parley.test>"),
        ("Call-ID", "a84b4c76e66710@pc33.example.com"),
        ("Proxy-Authorization", 'Digest username="alice"'),
    ),
)


@dataclass
class Flow:
    app: Starlette
    pending: PendingCalls
    receiver: Receiver
    sdk: openai.AsyncOpenAI
    http: httpx.AsyncClient

    def gate(self, url: str | None = None) -> WebhookCallGate:
        sender = WebhookSender(url or self.receiver.url, SECRET, backoff_s=0.01)
        return WebhookCallGate(sender, self.pending)

    def on_webhook(self, decide: Any) -> None:
        """The app's handler: verify the delivery, then `decide(call_id)` with the SDK."""

        async def handler(delivery: Delivery) -> None:
            event = self.sdk.webhooks.unwrap(delivery.body, delivery.headers, secret=SECRET)
            assert isinstance(event, RealtimeCallIncomingWebhookEvent)
            await decide(event.data.call_id)

        self.receiver.handler = handler


@pytest.fixture
async def flow() -> AsyncIterator[Flow]:
    app = create_app(Settings(api_key=API_KEY), "redis://unused")
    pending = PendingCalls(deadline_s=5)
    setattr(app.state, PENDING_CALLS_STATE, pending)
    async with contextlib.AsyncExitStack() as stack:
        receiver = await stack.enter_async_context(webhook_receiver())
        base = await stack.enter_async_context(serving(app))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=base))
        sdk = openai.AsyncOpenAI(api_key=API_KEY, base_url=f"{base}/v1", max_retries=0)
        stack.push_async_callback(sdk.close)
        yield Flow(app, pending, receiver, sdk, http)


async def decide(flow: Flow, call: IncomingCall = CALL) -> Any:
    gate = flow.gate()
    async with gate.sender:
        return await gate.decide(call)


async def test_the_app_accepts_with_a_session_from_its_webhook_handler(flow: Flow) -> None:
    async def accept(call_id: str) -> None:
        await flow.sdk.realtime.calls.accept(
            call_id,
            type="realtime",
            instructions="You answer the phone for Example Dental. Be brief.",
            audio={"output": {"speed": 1.25}},
        )

    flow.on_webhook(accept)
    decision = await decide(flow)
    assert isinstance(decision, Accept)
    assert decision.call_id.startswith("rtc_")
    assert decision.config.instructions == "You answer the phone for Example Dental. Be brief."
    assert decision.config.speed == 1.25
    (delivery,) = flow.receiver.deliveries
    event = flow.sdk.webhooks.unwrap(delivery.body, delivery.headers, secret=SECRET)
    assert isinstance(event, RealtimeCallIncomingWebhookEvent)
    assert event.data.call_id == decision.call_id  # the app's id, not the SIP Call-ID
    names = [h.name for h in event.data.sip_headers]
    assert names == ["From", "To", "Call-ID"]  # no authorization header reaches the app
    assert len(flow.pending) == 0


async def test_the_app_accepts_after_answering_the_webhook(flow: Flow) -> None:
    """The usual shape too: answer 200 at once, decide a moment later."""
    gate = flow.gate()
    async with gate.sender:
        deciding = asyncio.create_task(gate.decide(CALL))
        await flow.receiver.delivered.wait()
        call_id = gate.call_id_of(CALL.call_id)
        assert call_id is not None
        assert call_id in flow.pending
        await flow.sdk.realtime.calls.accept(call_id, type="realtime")
        decision = await deciding
    assert isinstance(decision, Accept)
    assert decision.call_id == call_id
    assert gate.call_id_of(CALL.call_id) is None


async def test_reject_with_a_status(flow: Flow) -> None:
    async def reject(call_id: str) -> None:
        await flow.sdk.realtime.calls.reject(call_id, status_code=486)

    flow.on_webhook(reject)
    decision = await decide(flow)
    assert isinstance(decision, Reject)
    assert decision.rejection() == Rejection(486, "Busy Here")


async def test_reject_without_a_body_declines(flow: Flow) -> None:
    async def reject(call_id: str) -> None:
        response = await flow.http.post(
            f"/v1/realtime/calls/{call_id}/reject",
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
        assert response.status_code == 200

    flow.on_webhook(reject)
    decision = await decide(flow)
    assert isinstance(decision, Reject)
    assert decision.rejection() == Rejection(603, "Decline")


async def test_refer_sends_the_caller_elsewhere(flow: Flow) -> None:
    async def refer(call_id: str) -> None:
        await flow.sdk.realtime.calls.refer(call_id, target_uri="tel:+14155550123")

    flow.on_webhook(refer)
    assert await decide(flow) == Refer("tel:+14155550123")


async def test_an_unknown_call_is_404(flow: Flow) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        await flow.sdk.realtime.calls.accept("rtc_nope", type="realtime")
    assert raised.value.status_code == 404
    assert raised.value.code == "call_id_not_found"
    for action, body in (("reject", {}), ("refer", {"target_uri": "sip:a@b"})):
        response = await flow.http.post(
            f"/v1/realtime/calls/rtc_nope/{action}",
            json=body,
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "invalid_request_error"


BAD_BODIES = [
    ("accept", b'{"instructions": "hi"}', "type"),
    ("accept", b'{"type": "transcription"}', "type"),
    ("accept", b'{"type": "realtime", "instructions": 7}', None),
    ("accept", b'{"type": "realtime", "audio": {"output": {"speed": 9}}}', None),
    ("accept", b"[1, 2]", None),
    ("accept", b"{not json", None),
    ("reject", b'{"status_code": "busy"}', "status_code"),
    ("reject", b'{"status_code": 200}', "status_code"),
    ("reject", b'{"status_code": true}', "status_code"),
    ("reject", b'{"status_code": 486, "reason": "x"}', "reason"),
    ("refer", b"{}", "target_uri"),
    ("refer", b'{"target_uri": 5}', "target_uri"),
    ("refer", b'{"target_uri": "https://example.com"}', "target_uri"),
    ("refer", b'{"target_uri": "sip:a@b>\\r\\nX-Evil: 1"}', "target_uri"),
    ("refer", b'{"target_uri": "sip:a@b c"}', "target_uri"),
]


@pytest.mark.parametrize(("action", "body", "param"), BAD_BODIES)
async def test_a_bad_body_is_400_and_leaves_the_call_pending(
    flow: Flow, action: str, body: bytes, param: str | None
) -> None:
    flow.pending.open("rtc_waiting")
    response = await flow.http.post(
        f"/v1/realtime/calls/rtc_waiting/{action}",
        content=body,
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    assert "rtc_waiting" in flow.pending
    flow.pending.resolve("rtc_waiting", Reject())
    await flow.pending.wait("rtc_waiting")


async def test_deciding_needs_the_api_key(flow: Flow) -> None:
    flow.pending.open("rtc_auth")
    secret = (
        await flow.http.post(
            "/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {API_KEY}"}
        )
    ).json()["value"]
    for authorization in (None, "Bearer wrong", f"Bearer {secret}"):
        headers = {"Authorization": authorization} if authorization else {}
        response = await flow.http.post(
            "/v1/realtime/calls/rtc_auth/accept", json={"type": "realtime"}, headers=headers
        )
        assert response.status_code == 401
    assert "rtc_auth" in flow.pending
    flow.pending.resolve("rtc_auth", Reject())
    await flow.pending.wait("rtc_auth")


async def test_an_undeliverable_webhook_turns_the_call_away_at_once(flow: Flow) -> None:
    gate = flow.gate(closed_port_url())
    async with gate.sender:
        async with asyncio.timeout(3):  # not the 5 s decision deadline
            decision = await gate.decide(CALL)
    assert isinstance(decision, Reject)
    assert decision.status == 480
    assert len(flow.pending) == 0


async def test_an_app_that_refuses_the_webhook_turns_the_call_away(flow: Flow) -> None:
    flow.receiver.statuses = [401]
    decision = await decide(flow)
    assert isinstance(decision, Reject)
    assert decision.status == 480
    assert len(flow.receiver.deliveries) == 1


async def test_no_decision_in_time_is_480_and_a_late_accept_404(flow: Flow) -> None:
    flow.pending.deadline_s = 0.2
    decision = await decide(flow)
    assert decision == Reject(480, "no decision in time")
    (delivery,) = flow.receiver.deliveries
    event = flow.sdk.webhooks.unwrap(delivery.body, delivery.headers, secret=SECRET)
    assert isinstance(event, RealtimeCallIncomingWebhookEvent)
    with pytest.raises(openai.NotFoundError):
        await flow.sdk.realtime.calls.accept(event.data.call_id, type="realtime")


async def test_a_caller_who_hangs_up_first_withdraws_the_call(flow: Flow) -> None:
    gate = flow.gate()
    async with gate.sender:
        deciding = asyncio.create_task(gate.decide(CALL))
        await flow.receiver.delivered.wait()
        call_id = gate.call_id_of(CALL.call_id)
        assert gate.withdraw(CALL.call_id)
        assert not gate.withdraw(CALL.call_id)
        assert (await deciding).status == 487  # type: ignore[union-attr]
    assert call_id is not None
    with pytest.raises(openai.NotFoundError):
        await flow.sdk.realtime.calls.accept(call_id, type="realtime")


async def test_a_cancelled_decision_leaves_no_task_and_nothing_pending(flow: Flow) -> None:
    release = asyncio.Event()

    async def stall(_delivery: Delivery) -> None:
        await release.wait()

    flow.receiver.handler = stall
    gate = flow.gate()
    async with gate.sender:
        deciding = asyncio.create_task(gate.decide(CALL))
        await flow.receiver.delivered.wait()  # the webhook is in flight
        deciding.cancel()
        with pytest.raises(asyncio.CancelledError):
            await deciding
    release.set()
    assert len(flow.pending) == 0
    assert gate.call_id_of(CALL.call_id) is None
    assert not [t for t in asyncio.all_tasks() if t.get_name().endswith(":webhook")]


async def test_a_full_registry_answers_503(flow: Flow) -> None:
    flow.pending.limit = 0
    decision = await decide(flow)
    assert isinstance(decision, Reject)
    assert decision.rejection() == Rejection(503, "Service Unavailable")
    assert flow.receiver.deliveries == []
