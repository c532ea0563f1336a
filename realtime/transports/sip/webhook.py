"""The incoming-call webhooks: OpenAI's events, signed as OpenAI signs, POSTed.

Apps written for OpenAI Realtime over SIP learn of a call from `realtime.call.incoming`,
apps written for GPT-Live from `live.transport.incoming`, and verify it with their SDK
(`client.webhooks.unwrap(body, headers, secret=...)`). So the body is OpenAI's event
object (`data`: the call's id for the app -- a Realtime `call_id`, a Live `session_id` --
and the INVITE's headers as `{name, value}`, authorization headers left out as OpenAI
leaves them out), and the signature is Standard
Webhooks': `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, keyed with
the secret's bytes (`whsec_<base64>`, as the platform shows it, or any other string as is).

Delivery is bounded: a few attempts, each under a timeout, with a short pause between.
A phone is ringing meanwhile, so a webhook that cannot be delivered quickly is a failure
(`WebhookError`), not something to keep trying for hours as a mail queue would. An answer
of 5xx, 408 or 429, or no answer, is tried again; any other non-2xx is the app saying no.
Every attempt carries the same `webhook-id` (the app's key for deduplicating) and a fresh
timestamp and signature (the timestamp is the attempt's, so the app's replay window holds).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Iterable
from typing import Any

import httpx

from sessions.events import new_id

log = logging.getLogger("parley.realtime.sip.webhook")

EVENT_TYPE = "realtime.call.incoming"
LIVE_EVENT_TYPE = "live.transport.incoming"
SECRET_PREFIX = "whsec_"
USER_AGENT = "Parley/1.0 (incoming call webhooks)"
PRIVATE_HEADERS = frozenset({"authorization", "proxy-authorization"})
"""Never sent to the app (OpenAI leaves the INVITE's authorization headers out too)."""
RETRIED_STATUSES = frozenset({408, 429})
ATTEMPTS = 3
ATTEMPT_TIMEOUT_S = 5.0
BACKOFF_S = 0.5
"""The pause before the second attempt; it doubles before each further one."""


class WebhookError(RuntimeError):
    """The webhook could not be delivered (refused, or no answer in all the attempts)."""


def new_secret() -> str:
    """A fresh secret in the platform's form: `whsec_` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a secret: `whsec_<base64>` decoded, any other string as UTF-8."""
    if not secret:
        raise ValueError("the webhook secret is empty")
    if secret.startswith(SECRET_PREFIX):
        try:
            return base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except ValueError:
            raise ValueError("a whsec_ webhook secret must be base64 after the prefix") from None
    return secret.encode()


def sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value for one delivery attempt."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def _public(sip_headers: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    return [
        {"name": name, "value": value}
        for name, value in sip_headers
        if name.lower() not in PRIVATE_HEADERS
    ]


def _event(kind: str, data: dict[str, Any], created_at: int | None) -> dict[str, Any]:
    return {
        "object": "event",
        "id": new_id("evt"),
        "type": kind,
        "created_at": int(time.time()) if created_at is None else created_at,
        "data": data,
    }


def incoming_call_event(
    call_id: str, sip_headers: Iterable[tuple[str, str]], created_at: int | None = None
) -> dict[str, Any]:
    """OpenAI's `realtime.call.incoming` event for a call waiting for the app's decision."""
    data = {"call_id": call_id, "sip_headers": _public(sip_headers)}
    return _event(EVENT_TYPE, data, created_at)


def live_incoming_event(
    session_id: str, sip_headers: Iterable[tuple[str, str]], created_at: int | None = None
) -> dict[str, Any]:
    """OpenAI's `live.transport.incoming` for a SIP call waiting for a GPT-Live app's
    decision. `sip_media_security` is `rtp`: Parley's SIP media is plain RTP (no SRTP).
    (`live.transport.connected` is WebRTC's and Instant Connect's: a SIP call has none.)"""
    data = {
        "type": "sip",
        "session_id": session_id,
        "sip_headers": _public(sip_headers),
        "sip_media_security": "rtp",
    }
    return _event(LIVE_EVENT_TYPE, data, created_at)


class WebhookSender:
    """POSTs signed events to one URL; owns its HTTP client (`aclose()`, or `async with`)."""

    def __init__(
        self,
        url: str,
        secret: str,
        *,
        attempts: int = ATTEMPTS,
        attempt_timeout_s: float = ATTEMPT_TIMEOUT_S,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the webhook URL must be http:// or https://, got {url!r}")
        if attempts < 1:
            raise ValueError("a webhook needs at least one attempt")
        self.url = url
        self._key = secret_key(secret)
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(attempt_timeout_s), follow_redirects=False
        )

    async def __aenter__(self) -> WebhookSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Idempotent (httpx's client close is)."""
        await self._client.aclose()

    def headers(self, webhook_id: str, body: bytes) -> dict[str, str]:
        timestamp = int(time.time())
        return {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": webhook_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self._key, webhook_id, timestamp, body),
        }

    async def send(self, event: dict[str, Any]) -> None:
        """Deliver `event`: returns at the app's first 2xx; WebhookError if none came."""
        body = json.dumps(event, separators=(",", ":")).encode()
        webhook_id = new_id("wh")
        pause = self.backoff_s
        problem = ""
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                await asyncio.sleep(pause)
                pause *= 2
            try:
                response = await self._client.post(
                    self.url, content=body, headers=self.headers(webhook_id, body)
                )
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}".rstrip(": ")
                log.info("webhook %s attempt %d: %s", webhook_id, attempt, problem)
                continue
            status = response.status_code
            if 200 <= status < 300:
                return
            problem = f"the app answered {status}"
            log.info("webhook %s attempt %d: %s", webhook_id, attempt, problem)
            if status < 500 and status not in RETRIED_STATUSES:
                break
        raise WebhookError(f"webhook {event.get('type')} to {self.url} not delivered: {problem}")
