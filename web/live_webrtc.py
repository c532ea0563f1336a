"""`POST /v1/live/sessions`: GPT-Live over WebRTC, as the `openai` SDK's
`client.live.create()` and OpenAI's browser guide make it.

The body is JSON: `{"session": <the GPT-Live session config>, "transport": {"type":
"webrtc", "sdp": <the offer>}}`; the answer is 201 with `{"session": {"id"}, "transport":
{"type": "webrtc", "sdp": <the answer>}}`. The page then applies the answer and waits for
`session.started` on its `oai-events` data channel (realtime/live/live_webrtc_call.py).

Auth is the other routes': `Authorization: Bearer <API key or ephemeral secret>` (a secret
counts against the key that minted it). The session config is GPT-Live's, strict (an
unknown field is refused, naming it); its audio format is not a setting here (WebRTC
negotiates Opus on the media track). A request that cannot be served gets a JSON error in
OpenAI's shape (`type`, `code`, `message`, `param`): 400 for a bad body, config or offer,
413 for a body over `MAX_BODY_BYTES`, 415 for a body that is not JSON, 401 for a bad key,
429 at the caller's limits, 503 at the session cap or when the call cannot be set up.
Nothing (session, peer connection, a duplex model's place) is left behind by a refusal; a
duplex model that holds all it can refuses as the session cap does (sessions/manager.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from realtime.auth import AuthError, with_caller
from realtime.live.live_config import LiveConfigError, parley_config, parse_live_config
from realtime.transports.webrtc.registry import CallSetupError
from realtime.transports.webrtc.sdp import OfferError, OfferTooLarge
from realtime.transports.websocket.denial import TOO_MANY_REQUESTS, retry_after
from sessions import SessionConfig, SessionLimitError
from sessions.errors import KeyLimitError

from .services import services_of

if TYPE_CHECKING:  # aiortc is loaded at the first offer (realtime/transports/webrtc/registry.py)
    from aiortc import RTCPeerConnection

    from realtime.live.live_config import LiveSessionConfig
    from realtime.live.live_webrtc_call import LiveCall

log = logging.getLogger("parley.web.live")

MAX_BODY_BYTES = 1024 * 1024
"""The offer (64 KiB at most) and a session config (instructions, up to 128 items)."""
FIELDS = ("session", "transport")
ReadOffer = Callable[[dict[str, Any]], Awaitable[tuple[bytes, "LiveSessionConfig"]]]
"""The offer and the session config of a request's JSON body."""
TRANSPORT_FIELDS = ("type", "sdp")


class BadRequest(ValueError):
    def __init__(self, code: str, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.code = code
        self.param = param
        self.status = status


def error(
    status: int,
    code: str,
    message: str,
    param: str | None = None,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"type": kind, "code": code, "message": message, "param": param}
    return JSONResponse({"error": body}, status, headers)


async def create_live_session(request: Request) -> Response:
    async def read(body: dict[str, Any]) -> tuple[bytes, LiveSessionConfig]:
        return _request(body)

    return await answer_offer(request, read)


async def answer_offer(request: Request, read: ReadOffer) -> Response:
    """A GPT-Live session over WebRTC, its offer and config read from the body by `read`
    (a new session's, or a fork's: web/live_stored.py), which may raise BadRequest or
    LiveConfigError."""
    services = services_of(request)
    if services.running is None:
        return error(503, "not_ready", "the server is not ready yet", kind="server_error")
    running = services.running
    try:
        host = request.client.host if request.client is not None else None
        grant = with_caller(services.auth.check(request.headers.get("authorization")), host)
    except AuthError as exc:
        return error(401, "invalid_api_key", str(exc))
    try:
        if grant.caller is not None:  # before the offer's (costly) answer
            await running.manager.check_caller(grant.caller)
        offer, live = await read(await _body(request))
        config, _formats = parley_config(live, SessionConfig())
    except BadRequest as exc:
        return error(exc.status, exc.code, str(exc), exc.param)
    except LiveConfigError as exc:
        return error(400, exc.code, str(exc), exc.param)
    except KeyLimitError as exc:
        return error(TOO_MANY_REQUESTS, exc.code, str(exc), None, exc.error_type, retry_after(exc))
    registry = running.calls

    def make_call(call_id: str, pc: RTCPeerConnection) -> LiveCall:
        from realtime.live.live_webrtc_call import LiveCall

        return LiveCall(call_id, pc, live, registry.metrics, registry.slow, services.live_sessions)

    try:
        call, answer = await registry.create(
            offer, config, caller=grant.caller, make_call=make_call
        )
    except OfferTooLarge as exc:
        return error(413, "offer_too_large", str(exc), "transport.sdp")
    except OfferError as exc:
        return error(400, "invalid_offer", str(exc), "transport.sdp")
    except KeyLimitError as exc:
        return error(TOO_MANY_REQUESTS, exc.code, str(exc), None, exc.error_type, retry_after(exc))
    except SessionLimitError as exc:
        return error(503, "session_limit", str(exc), kind="server_error")
    except CallSetupError as exc:
        return error(503, exc.code, str(exc), kind="server_error")
    assert call.session is not None
    session_id = call.session.session_id
    log.info("GPT-Live session %s over WebRTC (call %s)", session_id, call.call_id)
    return JSONResponse(
        {"session": {"id": session_id}, "transport": {"type": "webrtc", "sdp": answer}}, 201
    )


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object in the body, read no further than MAX_BODY_BYTES."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        got = f"got {kind!r}" if kind else "got no Content-Type"
        raise BadRequest("unsupported_media_type", f"send a JSON body ({got})", status=415)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            why = f"the body is over the limit of {MAX_BODY_BYTES} bytes"
            raise BadRequest("request_too_large", why, status=413)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("invalid_json", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("invalid_type", "the body must be a JSON object")
    return body


def _request(body: dict[str, Any]) -> tuple[bytes, LiveSessionConfig]:
    """The offer and the session config of a body; BadRequest, LiveConfigError."""
    known(body, FIELDS, "")
    live = parse_live_config(body["session"])
    if live.audio is not None and live.audio.format is not None:
        why = "the audio format is negotiated on the media track (Opus), not set here"
        raise LiveConfigError(why, "unknown_parameter", "session.audio.format")
    return offer_of(body), live


def offer_of(body: dict[str, Any]) -> bytes:
    """The SDP offer of a body's `transport`; BadRequest naming the field."""
    transport = body["transport"]
    if not isinstance(transport, dict):
        raise BadRequest("invalid_type", "`transport` is an object", "transport")
    known(transport, TRANSPORT_FIELDS, "transport.")
    if transport["type"] != "webrtc":
        why = "transport.type must be 'webrtc' (a WebSocket opens this path instead)"
        raise BadRequest("invalid_value", why, "transport.type")
    sdp = transport["sdp"]
    if not isinstance(sdp, str) or not sdp.strip():
        raise BadRequest("invalid_value", "transport.sdp is the SDP offer", "transport.sdp")
    return sdp.encode()


def known(
    body: dict[str, Any], fields: tuple[str, ...], prefix: str, optional: tuple[str, ...] = ()
) -> None:
    """Every field of `body` known (one of `fields` or `optional`) and every one of
    `fields` given."""
    for name in sorted(body):
        if name not in fields and name not in optional:
            why = f"Unknown parameter: '{prefix}{name}'."
            raise BadRequest("unknown_parameter", why, f"{prefix}{name}")
    for name in fields:
        if name not in body:
            why = f"Missing required parameter: '{prefix}{name}'."
            raise BadRequest("missing_required_parameter", why, f"{prefix}{name}")
