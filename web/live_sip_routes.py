"""GPT-Live's SIP call control: `POST /v1/live/sessions/{session_id}/accept|reject|refer|hangup`.

With `--sip-api live` a SIP call rings while a GPT-Live app decides (its signed
`live.transport.incoming` names the call's `live_...` session id); the `openai` SDK's
`client.live.sessions.accept|reject|refer|hangup` then land here:

- `accept` `{"session": {"type": "live", "model": ..., ...}}`: the session configuration
  as `session.start` takes it, strict (live_config.parse_accept_session), without
  `audio.format` (SIP negotiates it). The call is answered as a GPT-Live session of that
  id; its control plane is a sideband (`/v1/live/sessions/{id}/attach`).
- `reject` `{"status_code": 300-699}` (required): the caller gets that final status.
- `refer` `{"target_uri": "sip:...|sips:...|tel:..."}`: a ringing call is redirected
  there (a 302 whose Contact is the target), an answered one transferred (a REFER in its
  dialog: sip_transfer.py), as the Realtime flow's refer does.
- `hangup`: an answered call ends with a BYE (`session.closed` says `close_requested`);
  a ringing one is declined (603). A live session of this process on another transport (a
  GPT-Live WebSocket or WebRTC call) ends too, as its own `session.close` would end it. A
  session another worker process owns, or a SIP call ringing or answered there, is hung
  up there: the request is relayed to that process and served by this route there
  (web/call_controls.py, realtime/request_relay.py), and the route answers once that process
  says it has ended it (503 `owner_unavailable` when it does not say within 5 s).

With `--workers N` the decisions and transfers land on any worker and are served by the
one that has the call (web/call_controls.py).

They need the API key (an ephemeral secret is refused: 401) and answer 200 with no body;
errors are OpenAI's shape (`message`, `type`, `param`, `code`): 404 for a session id that
is neither ringing nor live here (for a hangup: on any worker), 409 for a decision on a
call already answered (a second accept, a reject after the accept), 400 for a body OpenAI
would refuse (naming the field; the call keeps ringing, so the app can still decide).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from realtime.auth import AuthError
from realtime.live.live_config import LiveConfigError, parley_config, parse_accept_session
from realtime.live.live_protocol import CLOSE_REQUESTED
from realtime.transports.sip.call_gate import WebhookCallGate
from realtime.transports.sip.media_calls import SipCallNotFound, SipMediaCalls
from realtime.transports.sip.pending_calls import (
    Accept,
    Decision,
    PendingCalls,
    Refer,
    Reject,
    describe,
)
from sessions import SessionConfig

from .call_controls import OwnerUnavailable, relay_hangup
from .services import Services, services_of
from .sip_transfer import transfer

log = logging.getLogger("parley.web.live_sip")

MAX_BODY_BYTES = 1024 * 1024
MAX_TARGET_URI = 1024
TARGET_SCHEMES = ("sip:", "sips:", "tel:")


class Refused(Exception):
    """An OpenAI-shaped error answer: HTTP status, `code`, message, `param`, `type`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.kind = kind

    def response(self) -> Response:
        body = {"message": str(self), "type": self.kind, "param": self.param}
        return JSONResponse({"error": {**body, "code": self.code}}, self.status)


def _sip(services: Services) -> tuple[SipMediaCalls, PendingCalls] | None:
    """This server's SIP calls and the calls ringing for an app, when it serves GPT-Live's
    SIP flow (`--sip-port`, `--sip-webhook`, `--sip-api live`)."""
    running = services.running
    if running is None or running.sip is None or services.settings.sip_api != "live":
        return None
    gate = running.sip.gate
    return (running.sip, gate.pending) if isinstance(gate, WebhookCallGate) else None


def _answered(calls: SipMediaCalls, session_id: str) -> bool:
    """The app has accepted the call: it is answered, or its answer is being made."""
    return calls.knows(session_id)


async def _body(request: Request, fields: frozenset[str]) -> dict[str, Any]:
    """The JSON object in the body ({} for none), with no field but `fields`."""
    declared = request.headers.get("content-length", "")
    raw = bytearray()
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise Refused(400, "request_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise Refused(400, "request_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Refused(400, "invalid_json", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "invalid_type", "the body must be a JSON object")
    for name in body:
        if name not in fields:
            raise Refused(400, "unknown_parameter", f"Unknown parameter: '{name}'.", name)
    return body


def _accept(session_id: str, body: dict[str, Any]) -> Accept:
    if "session" not in body:
        raise Refused(400, "missing_required_parameter", "session is required", "session")
    try:
        live = parse_accept_session(body["session"])
        config, _formats = parley_config(live, SessionConfig())  # the formats: SIP's own
    except LiveConfigError as exc:
        raise Refused(400, exc.code, str(exc), exc.param) from None
    return Accept(session_id, config, live=live)


def _reject(body: dict[str, Any]) -> Reject:
    if "status_code" not in body:
        raise Refused(400, "missing_required_parameter", "status_code is required", "status_code")
    status = body["status_code"]
    if isinstance(status, bool) or not isinstance(status, int) or not 300 <= status <= 699:
        message = f"status_code must be a SIP status from 300 to 699, got {status!r}"
        raise Refused(400, "invalid_value", message, "status_code")
    return Reject(status, "the app rejected the call")


def _refer(body: dict[str, Any]) -> Refer:
    target = body.get("target_uri")
    if not isinstance(target, str) or not target.strip():
        message = "target_uri is required (a nonblank URI)"
        raise Refused(400, "missing_required_parameter", message, "target_uri")
    unsafe = any(ord(c) < 0x21 or c in '<>"' or ord(c) == 0x7F for c in target)
    if not target.lower().startswith(TARGET_SCHEMES) or unsafe or len(target) > MAX_TARGET_URI:
        message = (
            f"target_uri must be a sip:, sips: or tel: URI of at most {MAX_TARGET_URI} "
            "characters, with no spaces, quotes or angle brackets"
        )
        raise Refused(400, "invalid_value", message, "target_uri")
    return Refer(target)


def _checked(request: Request) -> tuple[SipMediaCalls, PendingCalls, str]:
    """The API key, then the SIP side and the session id (404 when nothing serves it)."""
    services = services_of(request)
    try:
        services.auth.check_key(request.headers.get("authorization"))
    except AuthError as exc:
        raise Refused(401, "invalid_api_key", str(exc)) from None
    session_id: str = request.path_params["session_id"]
    sip = _sip(services)
    if sip is None:
        message = f"no SIP session {session_id}: this server takes no GPT-Live SIP calls"
        raise Refused(404, "session_not_found", message, "session_id")
    calls, pending = sip
    if session_id not in pending and not _answered(calls, session_id):
        raise Refused(404, "session_not_found", f"no SIP session {session_id}", "session_id")
    return calls, pending, session_id


async def _decide(request: Request, fields: frozenset[str], kind: str) -> Response:
    """The app's decision on a ringing call: checked, then handed to the call."""
    try:
        calls, pending, session_id = _checked(request)
        body = await _body(request, fields)
        decision: Decision
        if kind == "accept":
            decision = _accept(session_id, body)
        elif kind == "reject":
            decision = _reject(body)
        else:
            decision = _refer(body)
        if not pending.resolve(session_id, decision):
            if isinstance(decision, Refer) and _answered(calls, session_id):
                transferred = await transfer(calls, session_id, decision.target_uri)
                if transferred is not None:
                    return transferred
            if _answered(calls, session_id):
                message = f"session {session_id} has been accepted already (no {kind} now)"
                raise Refused(409, "session_already_accepted", message, "session_id")
            raise Refused(404, "session_not_found", f"no SIP session {session_id}", "session_id")
    except Refused as refused:
        return refused.response()
    log.info("live session %s: %s by the app", session_id, describe(decision))
    return Response(status_code=200)


async def accept_session(request: Request) -> Response:
    return await _decide(request, frozenset({"session"}), "accept")


async def reject_session(request: Request) -> Response:
    return await _decide(request, frozenset({"status_code"}), "reject")


async def refer_session(request: Request) -> Response:
    return await _decide(request, frozenset({"target_uri"}), "refer")


async def hangup_session(request: Request) -> Response:
    try:
        calls, pending, session_id = _checked(request)
        await _body(request, frozenset())
    except Refused as refused:
        if refused.status == 404:
            return await _hang_up_elsewhere(request, refused)
        return refused.response()
    if pending.resolve(session_id, Reject(603, "hung up by the app before answering")):
        return Response(status_code=200)
    try:
        await calls.hangup(session_id, CLOSE_REQUESTED)
    except SipCallNotFound:
        message = f"no SIP session {session_id}"
        return Refused(404, "session_not_found", message, "session_id").response()
    return Response(status_code=200)


async def _hang_up_elsewhere(request: Request, not_found: Refused) -> Response:
    """A session that is no SIP call of this process: a live one here (a WebSocket's, a
    WebRTC call's), else one another worker process owns, hung up there by this route
    (the request relayed: call_controls.relay_hangup); `not_found` when none has it."""
    services = services_of(request)
    session_id: str = request.path_params["session_id"]
    if _hang_up_live(services, session_id):
        return Response(status_code=200)
    running = services.running
    if running is None:
        return not_found.response()
    manager, index = running.manager, running.call_index

    async def owner(session_id: str) -> str | None:
        """A SIP call's worker (ringing calls have no session yet), else the session's."""
        found = None if index is None else await index.owner(session_id)
        return found or await manager.ownership.owner(session_id)

    try:
        answer = await relay_hangup(request, session_id, owner)
    except OwnerUnavailable as exc:
        message = (
            f"the server process holding session {session_id} did not say within "
            f"{exc.within_s:g} s whether it hung up; try again"
        )
        return Refused(503, "owner_unavailable", message, kind="server_error").response()
    return not_found.response() if answer is None else answer


def _hang_up_live(services: Services, session_id: str) -> bool:
    """End a live session of this process that is no SIP call (a WebSocket's, a WebRTC
    call's) as its `session.close` would; False when there is none."""
    protocol = services.live_sessions.get(session_id)
    if protocol is None or protocol.ended:
        return False
    protocol.hang_up()
    return True
