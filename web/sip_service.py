"""SIP calls for `parley serve --sip-port`: the user agent server, the calls' media and, with
`--sip-webhook`, OpenAI's call flow, made and closed together by the app's lifespan.

The pieces live in `realtime/transports/sip/`: `SipServer` (signalling) drives
`SipMediaCalls` (SDP, RTP and a session per call) through the `CallHandler` seam, and the
media side ends a call from its end through the server's `hangup` and transfers one through
its `refer`. With a webhook,
every usable INVITE first goes to the app as a signed `realtime.call.incoming`
(`WebhookCallGate`), and the routes of `/v1/realtime/calls/{call_id}/accept|reject|refer`
resolve it through the `PendingCalls` kept in the app's state; a refer of an answered call
is a REFER in its dialog. With `--sip-api live` the webhook is GPT-Live's
`live.transport.incoming` and the routes `/v1/live/sessions/{session_id}/accept|...`
(live_sip_routes.py); an accepted call is then a GPT-Live session in `live_sessions`, for
Live sidebands to attach to. A ringing call's id is in the call index before its webhook
goes out, so the app's decision may land on any worker (call_controls.py).

Bound to a wildcard host (0.0.0.0, ::), the SDP answers name this host's outward address,
found without sending anything (a UDP socket's local address once it is "connected").
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from realtime.call_index import CallIndex
from realtime.live.live_sideband import LiveSessions
from realtime.transports.sip.call_gate import WebhookCallGate
from realtime.transports.sip.media_calls import SipMediaCalls
from realtime.transports.sip.pending_calls import PendingCalls
from realtime.transports.sip.uas import SipServer
from realtime.transports.sip.webhook import WebhookSender
from sessions import SessionManager

from .realtime_routes import PENDING_CALLS_STATE
from .settings import Settings

log = logging.getLogger("parley.web.sip")

WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True, slots=True)
class SipService:
    server: SipServer
    calls: SipMediaCalls


def outward_address(host: str) -> str | None:
    """The address to put in SDP for sockets bound to `host` (None: `host` itself)."""
    if host not in WILDCARDS:
        return None
    family = socket.AF_INET6 if host == "::" else socket.AF_INET
    probe = "2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1"  # documentation nets
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((probe, 9))
            address: str = s.getsockname()[0]
        except OSError:  # no route anywhere: only this host can call
            return "::1" if family == socket.AF_INET6 else "127.0.0.1"
    return address


@contextlib.asynccontextmanager
async def sip_service(
    settings: Settings,
    manager: SessionManager,
    app_state: Any,
    live_sessions: LiveSessions | None = None,
    call_index: CallIndex | None = None,
) -> AsyncIterator[SipService]:
    """Serve SIP on `settings.sip_port` while the block runs; every call ends with it.
    `call_index`: where a ringing call's id is named before its webhook goes out."""
    assert settings.sip_port is not None
    server: SipServer | None = None

    async def hangup(call_id: str) -> None:
        if server is not None:
            await server.hangup(call_id)

    async def transfer(call_id: str, target_uri: str) -> int:
        return 481 if server is None else await server.refer(call_id, target_uri)

    sender = pending = gate = None
    if settings.sip_webhook:
        sender = WebhookSender(settings.sip_webhook, settings.sip_webhook_secret)
        pending = PendingCalls()
        announce = None if call_index is None else lambda call_id: call_index.add([call_id])
        gate = WebhookCallGate(sender, pending, settings.sip_api, announce)
    calls = SipMediaCalls(
        manager,
        hangup,
        host=settings.host,
        gate=gate,
        advertise=outward_address(settings.host),
        live_sessions=live_sessions,
        transfer=transfer,
    )
    server = SipServer(
        calls,
        host=settings.host,
        port=settings.sip_port,
        auth=settings.sip_auth,
        allow=settings.sip_allow or None,
    )
    setattr(app_state, PENDING_CALLS_STATE, pending)
    try:
        await server.start()
        log.info(
            "SIP on %s port %d (UDP and TCP)%s",
            settings.host,
            server.port,
            f", calls announced to {settings.sip_webhook}" if sender else "",
        )
        yield SipService(server, calls)
    finally:
        await server.close()  # BYE to every call first, then the calls' media and sessions
        await calls.close()
        if sender is not None:
            await sender.aclose()
        setattr(app_state, PENDING_CALLS_STATE, None)
