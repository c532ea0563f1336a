"""`/v1/realtime`: OpenAI Realtime over a WebSocket, as the `openai` SDKs connect to it.

Auth is the signaling's: `Authorization: Bearer <API key or ephemeral secret>`, or, for a
browser (which cannot set headers on a WebSocket), the subprotocol
`openai-insecure-api-key.<key>`; the `realtime` subprotocol is echoed when offered. A bad
key is refused before the upgrade: HTTP 401 where the server supports denial responses,
else a close with 1008. `model` is accepted and ignored (the pipeline is the server's).
`intent=transcription` starts a transcription session (sessions/transcription_session.py).
`session_id`, `resume_token` and `last_event_id` resume a session after a dropped
connection (see realtime.openai.websocket). `call_id` attaches to a running WebRTC call
instead (a sideband: realtime.openai.sideband); an unknown call is refused before the
upgrade with HTTP 404 (`call_not_found`). A new session's key (or, with no key, address)
at its limits is refused before the upgrade with HTTP 429 (`rate_limit_exceeded`).
"""

from __future__ import annotations

from typing import Any

from starlette.websockets import WebSocket

from realtime.openai.client_events import ProtocolError, SessionUpdate, session_patch
from realtime.openai.sideband import serve_sideband
from realtime.openai.websocket_accept import ConnectRequest, serve_openai_realtime
from realtime.sideband_relay import Serve, relay_sideband
from realtime.slow_clients import SlowClients
from realtime.transports.webrtc.registry import CallNotFound
from realtime.transports.websocket.denial import deny
from sessions import ConfigError, SessionConfig, SessionManager

from .services import Running, services_of
from .ws_admission import admit

KEY_PROTOCOL = "openai-insecure-api-key."
BETA_PROTOCOL = "openai-beta.realtime-v1"
CALL_SIDEBAND = "realtime_call"
"""The protocol's name among relayed sidebands (realtime/sideband_relay.py)."""


async def openai_realtime(websocket: WebSocket) -> None:
    services = services_of(websocket)
    offered: list[str] = list(websocket.scope.get("subprotocols") or [])
    authorization = websocket.headers.get("authorization")
    for protocol in offered:
        if protocol.startswith(KEY_PROTOCOL):
            authorization = f"Bearer {protocol[len(KEY_PROTOCOL) :]}"
    query = websocket.query_params
    call_id = query.get("call_id")
    resuming = call_id is not None or bool(query.get("session_id"))
    admitted = await admit(websocket, authorization, new_session=not resuming)
    if admitted is None:
        return
    grant, manager = admitted
    subprotocol = "realtime" if "realtime" in offered else None
    if call_id is not None:
        await _sideband(websocket, manager, call_id, subprotocol)
        return
    try:
        kind = "transcription" if query.get("intent") == "transcription" else "realtime"
        body: dict[str, Any] = {"type": kind, **(grant.session or {})}
        patch, formats = session_patch(SessionUpdate.model_validate({"session": body}))
        config = SessionConfig().updated(patch)
    except (ConfigError, ProtocolError) as exc:  # a secret minted with bad settings
        await deny(websocket, 400, getattr(exc, "code", "invalid_value"), str(exc))
        return
    beta = "realtime=v1" in websocket.headers.get("openai-beta", "") or BETA_PROTOCOL in offered
    request = ConnectRequest(
        config=config,
        formats=formats,
        beta=beta,
        subprotocol=subprotocol,
        session_id=query.get("session_id") or None,
        resume_token=query.get("resume_token") or None,
        last_event_id=query.get("last_event_id") or None,
        grace_s=services.resume_grace_s,
        caller=grant.caller,
        slow=services.slow_clients,
    )
    await serve_openai_realtime(websocket, manager, services.websockets, request)


async def _sideband(
    websocket: WebSocket, manager: SessionManager, call_id: str, subprotocol: str | None
) -> None:
    services = services_of(websocket)
    running = services.running
    serve = find_call_sideband(running, manager, call_id, services.slow_clients)
    if serve is not None:
        await serve(websocket, subprotocol)
        return
    if running is not None and running.call_index is not None and services.redis is not None:
        owner = await running.call_index.owner(call_id)
        request = {"protocol": CALL_SIDEBAND, "target": call_id, "subprotocol": subprotocol}
        if await relay_sideband(websocket, services.redis, manager.beat, owner, request):
            return
    await deny(websocket, 404, "call_not_found", f"no live call {call_id!r}")


def find_call_sideband(
    running: Running | None, manager: SessionManager, call_id: str, slow: SlowClients
) -> Serve | None:
    """How to serve a sideband of this process's live call `call_id` (WebRTC or SIP) on
    a WebSocket; None when there is no such call here, or it is hanging up."""
    if running is None:
        return None
    try:
        call = running.call(call_id)
    except CallNotFound:
        return None
    if call.events.ended or call.session is None or call.session.closed:
        return None  # hanging up: nothing left to attach to
    if (live_id := call.live_session_id) is not None:
        message = (
            f"call {call_id!r} is a GPT-Live session: its sideband is "
            f"/v1/live/sessions/{live_id}/attach"
        )

        async def refuse(websocket: WebSocket, subprotocol: str | None) -> None:
            await deny(websocket, 409, "call_is_live_session", message)

        return refuse

    async def serve(websocket: WebSocket, subprotocol: str | None) -> None:
        await serve_sideband(websocket, manager, call, subprotocol, slow)

    return serve
