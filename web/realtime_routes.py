"""OpenAI Realtime's WebRTC signaling: client secrets, calls, hang-up.

Code written for OpenAI's browser guide works against Parley by changing the base URL:
`POST /v1/realtime/client_secrets` mints an ephemeral secret carrying session settings;
`POST /v1/realtime/calls` takes the SDP offer (raw `application/sdp`, or the multipart form
with `sdp` and `session` parts that the `openai` SDK sends) and answers 201 with the SDP
answer and a `Location` for the call; `POST /v1/realtime/calls/{call_id}/hangup` ends it
(a call another worker process holds is hung up there, the request relayed to it as call
control's is: call_controls.py, realtime/request_relay.py; 200 once it has ended, 404
`call_not_found` when no process has it, 503 `owner_unavailable` when its process does not
say within a few seconds).

OpenAI's SIP flow: a SIP call waiting for the app (its `realtime.call.incoming` webhook has
gone out) is decided by `POST /v1/realtime/calls/{call_id}/accept` (the body is a session
object, as `session.update` takes it, with `type: "realtime"`), `/reject` (`{status_code}`,
300-699, 603 if left out) or `/refer` (`{target_uri}`: sip:, sips: or tel:; a ringing call
is redirected, an answered one transferred with a REFER: sip_transfer.py). These need the
API key (not an ephemeral secret), answer 200 with no body, 404 for a call that is neither
waiting nor up, and 400 with an OpenAI-shaped error (`message`, `type`, `param`, `code`) for a body
OpenAI would refuse. With `--workers N` they land on any worker and are served by the one
that has the call (call_controls.py).

Re-attaching a call whose peer connection dropped (a phone that moved from Wi-Fi to mobile
data): the new offer goes to `POST /v1/realtime/calls` with the session's id and resume
token (both in `session.created`) and, optionally, the last `event_id` the client got:
headers `X-Parley-Session-Id`, `X-Parley-Resume-Token`, `X-Parley-Last-Event-Id`, or the
form's `session` part `{"parley": {"resume": {"session_id", "resume_token",
"last_event_id"}}}`. The new call joins that session (settings and history kept; other
settings in the request are ignored, the video rates aside); 404 `session_not_found` when
there is none to join (it ended, or the token is wrong), 400 `invalid_resume` for half a
claim.

A call that cannot be made is refused with a JSON error, never a 5xx unless the server is
at fault: 415 for any other Content-Type (a missing one included), 413 for an offer over
64 KiB (or a form over 1 MiB), 400 for an offer that is not UTF-8, not SDP, or one that
Parley or aiortc cannot answer, 503 at the session cap or when the server cannot set the
call up, 429 (`rate_limit_exceeded`, with `Retry-After` for the rate limit) when the
caller's key (or, with no key, its address) holds as many sessions as it may or started
them too fast (sessions/key_limits.py). A secret counts against the key that minted it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from realtime.auth import DEFAULT_TTL_S, AuthError, with_caller
from realtime.openai.client_events import ProtocolError, SessionUpdate, session_patch
from realtime.openai.server_events import session_object
from realtime.transports.sip.pending_calls import (
    Accept,
    Decision,
    PendingCalls,
    Refer,
    Reject,
    describe,
)
from realtime.transports.webrtc.call_options import CallOptions
from realtime.transports.webrtc.registry import (
    CallNotFound,
    CallSetupError,
    Reattach,
    ReattachRefused,
)
from realtime.transports.webrtc.sdp import MAX_OFFER_BYTES, OfferError, OfferTooLarge
from realtime.transports.websocket.denial import TOO_MANY_REQUESTS, retry_after
from sessions import ConfigError, SessionConfig, SessionLimitError
from sessions.errors import KeyLimitError

from .call_controls import OwnerUnavailable, relay_hangup, relayed
from .live_sip_routes import accept_session, hangup_session, refer_session, reject_session
from .live_stored import fork_live_session, live_fork, live_session_content
from .live_webrtc import create_live_session
from .live_ws import live_attach, live_sessions
from .realtime_ws import openai_realtime
from .services import services_of
from .sip_transfer import transfer
from .twilio_ws import twilio_media
from .video_ws import video_chat_stream

log = logging.getLogger("parley.web.realtime")

OFFER_TYPES = ("application/sdp", "multipart/form-data")
MAX_FORM_BYTES = 1024 * 1024
"""The openai SDK's form: the offer (64 KiB at most) and the session object."""


class UnsupportedMediaType(ValueError):
    pass


def error(
    status: int,
    code: str,
    message: str,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> Response:
    """OpenAI's error body; `param` names the parameter at fault, where one is."""
    body = {"type": kind, "code": code, "message": message, "param": param}
    return JSONResponse({"error": body}, status, headers)


def limited(exc: KeyLimitError) -> Response:
    return error(TOO_MANY_REQUESTS, exc.code, str(exc), exc.error_type, retry_after(exc))


def _settings(session: dict[str, Any] | None) -> tuple[SessionConfig, CallOptions]:
    """An OpenAI-style session object -> Parley settings; ConfigError / ProtocolError."""
    body = dict(session or {})
    body.setdefault("type", "realtime")
    patch, _formats = session_patch(SessionUpdate.model_validate({"session": body}))
    extras = body.get("parley") or {}
    defaults = CallOptions()
    try:
        options = CallOptions(
            video_fps_idle=float(extras.get("video_fps_idle", defaults.video_fps_idle)),
            video_fps_speaking=float(extras.get("video_fps_speaking", defaults.video_fps_speaking)),
        )
    except (TypeError, ValueError):
        raise ConfigError("parley.video_fps", "must be a number of frames per second") from None
    if not (0 < options.video_fps_idle <= 30 and 0 < options.video_fps_speaking <= 30):
        raise ConfigError("parley.video_fps", "must be between 0 and 30 frames per second")
    return SessionConfig().updated(patch), options


async def client_secrets(request: Request) -> Response:
    auth = services_of(request).auth
    try:
        minter = auth.check_key(request.headers.get("authorization"))
    except AuthError as exc:
        return error(401, "invalid_api_key", str(exc))
    try:
        body = await request.json() if await request.body() else {}
    except json.JSONDecodeError:
        return error(400, "invalid_json", "the body is not valid JSON")
    if not isinstance(body, dict):
        return error(400, "invalid_request", "the body must be a JSON object")
    expires = body.get("expires_after") or {}
    ttl = expires.get("seconds", DEFAULT_TTL_S) if isinstance(expires, dict) else None
    session = body.get("session") or {}
    if not isinstance(ttl, int) or not isinstance(session, dict):
        return error(400, "invalid_request", "expires_after.seconds and session must be given")
    try:
        config, _ = _settings(session)
        value, expires_at = auth.mint(session, ttl, minter.caller)
    except (ConfigError, ProtocolError, ValueError) as exc:
        code, param = getattr(exc, "code", "invalid_value"), getattr(exc, "field", None)
        return error(400, code, str(exc), param=param)
    return JSONResponse(
        {"value": value, "expires_at": expires_at, "session": session_object(config)}
    )


async def _part(value: UploadFile | str | None) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    return await value.read()


async def _capped_body(request: Request, limit: int) -> bytes:
    """The body, read no further than `limit` bytes (OfferTooLarge past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise OfferTooLarge(f"the request body is {int(declared)} bytes; the limit is {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise OfferTooLarge(f"the request body is over the limit of {limit} bytes")
    return bytes(body)


async def _offer_and_session(request: Request) -> tuple[bytes, dict[str, Any] | None]:
    """The offer and the form's session object; UnsupportedMediaType, OfferError."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in OFFER_TYPES:
        got = f"got {kind!r}" if kind else "got no Content-Type"
        raise UnsupportedMediaType(
            "send the SDP offer as the body with Content-Type: application/sdp, or as the "
            f"'sdp' part of a multipart/form-data form (as the openai SDK does); {got}"
        )
    if kind == "application/sdp":
        return await _capped_body(request, MAX_OFFER_BYTES), None
    body = await _capped_body(request, MAX_FORM_BYTES)

    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        async with Request(request.scope, replay).form(max_files=2, max_fields=4) as form:
            offer = await _part(form.get("sdp"))
            raw = await _part(form.get("session"))
    except (MultiPartException, HTTPException) as exc:
        raise OfferError(f"the multipart form could not be read: {_detail(exc)}") from None
    if not raw:
        return offer, None
    try:
        session = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise OfferError("the form's 'session' part is not valid JSON") from None
    if not isinstance(session, dict):
        raise OfferError("the form's 'session' part must be a JSON object")
    return offer, session


class InvalidReattach(ValueError):
    pass


def _reattach_headers(request: Request) -> Reattach | None:
    """A re-attach claimed in the request's headers; None when there is none."""
    headers = request.headers
    return _reattach(
        headers.get("x-parley-session-id"),
        headers.get("x-parley-resume-token"),
        headers.get("x-parley-last-event-id"),
    )


def _reattach_form(session: dict[str, Any] | None) -> Reattach | None:
    """A re-attach claimed in the form's session object (`parley.resume`), which is taken
    out of it (it is no setting)."""
    extras = (session or {}).get("parley")
    if not isinstance(extras, dict) or "resume" not in extras:
        return None
    resume = extras.pop("resume")
    if not isinstance(resume, dict):
        raise InvalidReattach("session.parley.resume must be an object")
    return _reattach(
        resume.get("session_id"), resume.get("resume_token"), resume.get("last_event_id")
    )


def _reattach(session_id: Any, token: Any, last_event_id: Any) -> Reattach | None:
    if not session_id and not token:
        return None
    if not (isinstance(session_id, str) and isinstance(token, str) and session_id and token):
        raise InvalidReattach(
            "a re-attach names the session and carries its resume token: give both "
            "(X-Parley-Session-Id and X-Parley-Resume-Token, or parley.resume's "
            "session_id and resume_token)"
        )
    last = last_event_id if isinstance(last_event_id, str) and last_event_id else None
    return Reattach(session_id, token, last)


def _detail(exc: MultiPartException | HTTPException) -> str:
    return exc.detail if isinstance(exc, HTTPException) else exc.message


async def create_call(request: Request) -> Response:
    services = services_of(request)
    if services.running is None:
        return error(503, "not_ready", "the server is not ready yet", "server_error")
    registry = services.running.calls
    try:
        host = request.client.host if request.client is not None else None
        grant = with_caller(services.auth.check(request.headers.get("authorization")), host)
    except AuthError as exc:
        return error(401, "invalid_api_key", str(exc))
    try:
        claim = _reattach_headers(request)
        if grant.caller is not None and claim is None:  # before the offer's (costly) answer
            await services.running.manager.check_caller(grant.caller)
        offer, form_session = await _offer_and_session(request)
        claim = claim or _reattach_form(form_session)
        config, options = _settings({**(grant.session or {}), **(form_session or {})})
        options = dataclasses.replace(options, grace_s=services.resume_grace_s)
        if claim is not None:
            call, answer = await registry.reattach(offer, claim, options, caller=grant.caller)
        else:
            call, answer = await registry.create(offer, config, options, caller=grant.caller)
    except InvalidReattach as exc:
        return error(400, "invalid_resume", str(exc))
    except ReattachRefused as exc:
        return error(404, exc.code, str(exc))
    except UnsupportedMediaType as exc:
        return error(415, "unsupported_media_type", str(exc))
    except OfferTooLarge as exc:
        return error(413, "offer_too_large", str(exc))
    except OfferError as exc:
        return error(400, "invalid_offer", str(exc))
    except (ConfigError, ProtocolError) as exc:
        return error(400, getattr(exc, "code", "invalid_value"), str(exc))
    except ValueError as exc:  # pydantic's ValidationError on a malformed session object
        return error(400, "invalid_session", f"the session object is not valid: {exc}")
    except KeyLimitError as exc:
        return limited(exc)
    except SessionLimitError as exc:
        return error(503, "session_limit", str(exc), "server_error")
    except CallSetupError as exc:
        return error(503, exc.code, str(exc), "server_error")
    if services.running.call_index is not None:  # a sideband may come to any worker at once
        await services.running.call_index.add([call.call_id])
    return Response(
        answer,
        status_code=201,
        media_type="application/sdp",
        headers={"Location": f"/v1/realtime/calls/{call.call_id}"},
    )


async def hangup(request: Request) -> Response:
    services = services_of(request)
    try:
        services.auth.check(request.headers.get("authorization"))
    except AuthError as exc:
        return error(401, "invalid_api_key", str(exc))
    call_id = request.path_params["call_id"]
    try:
        if services.running is None:
            raise CallNotFound(call_id)
        await services.running.hangup(call_id)
    except CallNotFound:
        try:
            answer = await _hang_up_elsewhere(request, call_id)
        except OwnerUnavailable as exc:
            message = (
                f"the server process holding call {call_id} did not say within "
                f"{exc.within_s:g} s whether it hung up; try again"
            )
            return error(503, "owner_unavailable", message, "server_error")
        if answer is None:
            return error(404, "call_not_found", f"no live call {call_id}")
        return answer
    return Response(status_code=200)


async def _hang_up_elsewhere(request: Request, call_id: str) -> Response | None:
    """A call not of this process: hung up by the worker process that holds it, found as a
    sideband finds it (the call index), through this route there (the request relayed:
    call_controls.relay_hangup); None when none has it."""
    running = services_of(request).running
    if running is None or running.call_index is None:
        return None
    return await relay_hangup(request, call_id, running.call_index.owner)


MAX_TARGET_URI = 1024
TARGET_SCHEMES = ("sip:", "sips:", "tel:")
PENDING_CALLS_STATE = "sip_pending_calls"
"""Where the SIP side puts its PendingCalls: `app.state.sip_pending_calls`."""


class InvalidDecision(ValueError):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


def openai_error(status: int, exc: InvalidDecision) -> Response:
    body = {"message": str(exc), "type": "invalid_request_error", "param": exc.param}
    return JSONResponse({"error": {**body, "code": exc.code}}, status)


def pending_calls_of(request: Request) -> PendingCalls | None:
    pending = getattr(request.app.state, PENDING_CALLS_STATE, None)
    return pending if isinstance(pending, PendingCalls) else None


async def _decision_body(request: Request, fields: frozenset[str] | None) -> dict[str, Any]:
    """The JSON object in the body ({} for none); `fields`: the only ones allowed."""
    try:
        raw = await _capped_body(request, MAX_FORM_BYTES)
    except OfferTooLarge as exc:
        raise InvalidDecision("request_too_large", str(exc)) from None
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidDecision("invalid_json", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidDecision("invalid_type", "the body must be a JSON object")
    for name in body:
        if fields is not None and name not in fields:
            raise InvalidDecision("unknown_parameter", f"Unknown parameter: '{name}'.", name)
    return body


def _accept(call_id: str, body: dict[str, Any]) -> Accept:
    kind = body.get("type")
    if kind != "realtime":
        got = "is missing" if kind is None else f"is {kind!r}"
        raise InvalidDecision("invalid_value", f"type must be 'realtime'; it {got}", "type")
    try:
        config, _options = _settings(body)
    except (ConfigError, ProtocolError) as exc:
        raise InvalidDecision(exc.code, str(exc), exc.field) from None
    except ValueError as exc:  # pydantic's ValidationError on a malformed session object
        raise InvalidDecision("invalid_value", f"the session is not valid: {exc}") from None
    return Accept(call_id, config)


def _reject(body: dict[str, Any]) -> Reject:
    status = body.get("status_code", 603)
    if isinstance(status, bool) or not isinstance(status, int) or not 300 <= status <= 699:
        message = f"status_code must be a SIP status from 300 to 699, got {status!r}"
        raise InvalidDecision("invalid_value", message, "status_code")
    return Reject(status, "the app rejected the call")


def _refer(body: dict[str, Any]) -> Refer:
    target = body.get("target_uri")
    if not isinstance(target, str) or not target:
        raise InvalidDecision(
            "missing_required_parameter", "target_uri is required (a string)", "target_uri"
        )
    unsafe = any(ord(c) < 0x21 or c in '<>"' or ord(c) == 0x7F for c in target)
    if not target.lower().startswith(TARGET_SCHEMES) or unsafe or len(target) > MAX_TARGET_URI:
        message = (
            "target_uri must be a sip:, sips: or tel: URI of at most "
            f"{MAX_TARGET_URI} characters, with no spaces, quotes or angle brackets"
        )
        raise InvalidDecision("invalid_value", message, "target_uri")
    return Refer(target)


async def _decide(
    request: Request, fields: frozenset[str] | None, parse: Callable[[dict[str, Any]], Decision]
) -> Response:
    """The app's decision on a SIP call waiting for it: checked, then handed to the call."""
    services = services_of(request)
    try:
        services.auth.check_key(request.headers.get("authorization"))
    except AuthError as exc:
        return error(401, "invalid_api_key", str(exc))
    call_id: str = request.path_params["call_id"]
    try:
        decision = parse(await _decision_body(request, fields))
    except InvalidDecision as exc:
        return openai_error(400, exc)
    pending = pending_calls_of(request)
    if pending is None or not pending.resolve(call_id, decision):
        running = services.running
        if isinstance(decision, Refer) and running is not None and running.sip is not None:
            transferred = await transfer(running.sip, call_id, decision.target_uri)
            if transferred is not None:
                return transferred
        message = f"no call {call_id} is waiting for a decision"
        return openai_error(404, InvalidDecision("call_id_not_found", message, "call_id"))
    log.info("call %s: %s by the app", call_id, describe(decision))
    return Response(status_code=200)


async def accept_call(request: Request) -> Response:
    call_id: str = request.path_params["call_id"]
    return await _decide(request, None, lambda body: _accept(call_id, body))


async def reject_call(request: Request) -> Response:
    return await _decide(request, frozenset({"status_code"}), _reject)


async def refer_call(request: Request) -> Response:
    return await _decide(request, frozenset({"target_uri"}), _refer)


SID = "session_id"
ROUTES = [
    Route("/v1/realtime/client_secrets", client_secrets, methods=["POST"]),
    Route("/v1/realtime/calls", create_call, methods=["POST"]),
    Route("/v1/realtime/calls/{call_id}/hangup", hangup, methods=["POST"]),
    Route("/v1/realtime/calls/{call_id}/accept", relayed(accept_call, "call_id"), methods=["POST"]),
    Route("/v1/realtime/calls/{call_id}/reject", relayed(reject_call, "call_id"), methods=["POST"]),
    Route("/v1/realtime/calls/{call_id}/refer", relayed(refer_call, "call_id"), methods=["POST"]),
    WebSocketRoute("/v1/realtime", openai_realtime),
    Route("/v1/live/sessions/{session_id}/accept", relayed(accept_session, SID), methods=["POST"]),
    Route("/v1/live/sessions/{session_id}/reject", relayed(reject_session, SID), methods=["POST"]),
    Route("/v1/live/sessions/{session_id}/refer", relayed(refer_session, SID), methods=["POST"]),
    Route("/v1/live/sessions/{session_id}/hangup", hangup_session, methods=["POST"]),
    Route("/v1/live/sessions", create_live_session, methods=["POST"]),
    WebSocketRoute("/v1/live/sessions", live_sessions),
    WebSocketRoute("/v1/live/sessions/{session_id}/attach", live_attach),
    Route("/v1/live/sessions/{session_id}/content", live_session_content, methods=["GET"]),
    Route("/v1/live/sessions/{session_id}/fork", fork_live_session, methods=["POST"]),
    WebSocketRoute("/v1/live/sessions/{session_id}/fork", live_fork),
    WebSocketRoute("/v1/video/chat/stream", video_chat_stream),
    WebSocketRoute("/v1/twilio/media", twilio_media),
]
