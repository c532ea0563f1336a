"""realtime/transports/sip/webhook.py: the realtime.call.incoming and live.transport.incoming
events, signed so that the official openai SDK's `webhooks.unwrap` accepts them, delivered with
bounded retries."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from openai.types.webhooks import (
    LiveTransportIncomingWebhookEvent,
    RealtimeCallIncomingWebhookEvent,
)

from realtime.transports.sip.webhook import (
    WebhookError,
    WebhookSender,
    incoming_call_event,
    live_incoming_event,
    new_secret,
    secret_key,
)

from .openai_sip_receiver import closed_port_url, webhook_receiver

SIP_HEADERS = (
    ("Via", "SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-1"),
    ("From", "<sip:+14155550100@example.com>;tag=1"),
    ("To", "<sip:agent@parley.test>"),
    ("Authorization", 'Digest username="alice", response="secret"'),
    ("X-Customer", "42"),
    ("X-Customer", "43"),
)


def sdk() -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1")


async def test_the_sdk_verifies_and_parses_the_event() -> None:
    secret = new_secret()
    async with webhook_receiver() as receiver, WebhookSender(receiver.url, secret) as sender:
        await sender.send(incoming_call_event("rtc_abc", SIP_HEADERS))
    (delivery,) = receiver.deliveries
    event = sdk().webhooks.unwrap(delivery.body, delivery.headers, secret=secret)
    assert isinstance(event, RealtimeCallIncomingWebhookEvent)
    assert event.type == "realtime.call.incoming"
    assert event.object == "event"
    assert event.data.call_id == "rtc_abc"
    # order and repeats kept, the authorization header left out (as OpenAI does)
    assert [(h.name, h.value) for h in event.data.sip_headers] == [
        h for h in SIP_HEADERS if h[0] != "Authorization"
    ]
    assert delivery.headers["content-type"] == "application/json"
    assert delivery.headers["webhook-signature"].startswith("v1,")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk().webhooks.unwrap(delivery.body, delivery.headers, secret=new_secret())
    tampered = delivery.body.replace(b"rtc_abc", b"rtc_abd")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk().webhooks.unwrap(tampered, delivery.headers, secret=secret)


async def test_the_sdk_verifies_and_parses_the_live_event() -> None:
    secret = new_secret()
    async with webhook_receiver() as receiver, WebhookSender(receiver.url, secret) as sender:
        await sender.send(live_incoming_event("live_abc", SIP_HEADERS))
    (delivery,) = receiver.deliveries
    event = sdk().webhooks.unwrap(delivery.body, delivery.headers, secret=secret)
    assert isinstance(event, LiveTransportIncomingWebhookEvent)
    assert event.type == "live.transport.incoming" and event.object == "event"
    assert event.data.type == "sip" and event.data.session_id == "live_abc"
    assert event.data.sip_media_security == "rtp"
    assert [(h.name, h.value) for h in event.data.sip_headers] == [
        h for h in SIP_HEADERS if h[0] != "Authorization"
    ]


async def test_a_plain_string_secret_signs_as_its_bytes() -> None:
    async with webhook_receiver() as receiver, WebhookSender(receiver.url, "s3cret") as sender:
        await sender.send(incoming_call_event("rtc_plain", ()))
    (delivery,) = receiver.deliveries
    event = sdk().webhooks.unwrap(delivery.body, delivery.headers, secret="s3cret")
    assert isinstance(event, RealtimeCallIncomingWebhookEvent)
    assert event.data.sip_headers == []


async def test_a_server_error_is_tried_again_with_the_same_id_and_a_fresh_signature() -> None:
    secret = new_secret()
    async with webhook_receiver() as receiver:
        receiver.statuses = [503, 429]
        async with WebhookSender(receiver.url, secret, backoff_s=0.01) as sender:
            await sender.send(incoming_call_event("rtc_retry", ()))
    assert len(receiver.deliveries) == 3
    assert len({d.headers["webhook-id"] for d in receiver.deliveries}) == 1
    for delivery in receiver.deliveries:  # each attempt's own signature verifies
        sdk().webhooks.verify_signature(delivery.body, delivery.headers, secret=secret)
    assert len({d.body for d in receiver.deliveries}) == 1


async def test_a_refusal_is_not_tried_again() -> None:
    async with webhook_receiver() as receiver:
        receiver.statuses = [400]
        async with WebhookSender(receiver.url, new_secret(), backoff_s=0.01) as sender:
            with pytest.raises(WebhookError, match="answered 400"):
                await sender.send(incoming_call_event("rtc_no", ()))
    assert len(receiver.deliveries) == 1


async def test_attempts_are_bounded_when_nobody_listens() -> None:
    async with WebhookSender(closed_port_url(), new_secret(), backoff_s=0.01) as sender:
        with pytest.raises(WebhookError, match="ConnectError"):
            await sender.send(incoming_call_event("rtc_gone", ()))


async def test_an_attempt_that_hangs_times_out() -> None:
    release = asyncio.Event()

    async def slow(_delivery: object) -> None:
        await release.wait()

    async with webhook_receiver() as receiver:
        receiver.handler = slow
        sender = WebhookSender(receiver.url, new_secret(), attempts=1, attempt_timeout_s=0.2)
        async with sender:
            with pytest.raises(WebhookError, match="Timeout"):
                await sender.send(incoming_call_event("rtc_slow", ()))
        release.set()


def test_secrets_and_urls_are_checked() -> None:
    assert len(secret_key(new_secret())) == 32
    with pytest.raises(ValueError, match="base64"):
        secret_key("whsec_not base64!")
    with pytest.raises(ValueError, match="empty"):
        secret_key("")
    with pytest.raises(ValueError, match="http"):
        WebhookSender("ftp://example.com/hook", "s")


def test_the_body_is_compact_json_of_the_event() -> None:
    event = incoming_call_event("rtc_x", (("To", "<sip:a@b>"),), created_at=1750287078)
    assert json.loads(json.dumps(event)) == {
        "object": "event",
        "id": event["id"],
        "type": "realtime.call.incoming",
        "created_at": 1750287078,
        "data": {"call_id": "rtc_x", "sip_headers": [{"name": "To", "value": "<sip:a@b>"}]},
    }
    assert event["id"].startswith("evt_")
