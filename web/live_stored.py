"""GPT-Live's stored sessions: the recording, and forks over WebRTC and over a WebSocket.

- `GET /v1/live/sessions/{id}/content` (`client.live.sessions.download_recording(id)`):
  the stored session's recording as a WAV file (stereo PCM16 at 16 kHz: left the user,
  right the model; realtime/live/live_recording.py).
- `POST /v1/live/sessions/{id}/fork` (`client.live.sessions.fork(id, transport=...)`):
  `{"transport": {"type": "webrtc", "sdp": <offer>}, "session": <overrides>?}`, answered
  as `POST /v1/live/sessions` is (201, `{"session": {"id"}, "transport": {"sdp"}}`), by
  the same code (web/live_webrtc.py).
- `/v1/live/sessions/{id}/fork` upgraded to a WebSocket (`client.live.forks.connect`):
  `session.start` with the overrides first, then a live session as on
  `/v1/live/sessions` (realtime/live/live_accept.py).

Auth is the other routes' (401 for a bad key). An unknown or expired stored session is a
404 in OpenAI's error shape (`session_not_found`, before any upgrade); a Redis that does
not answer is a 503. The stored sessions are in Redis, so any worker serves these.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from realtime.auth import AuthError, with_caller
from realtime.live.live_accept import serve_live
from realtime.live.live_config import LiveSessionConfig
from realtime.live.live_fork import forked, parse_fork
from realtime.live.live_recording import wav
from realtime.live.live_store import StoredSession, StoredSessions
from realtime.transports.websocket.denial import deny
from sessions import SessionConfig

from .live_webrtc import BadRequest, answer_offer, error, known, offer_of
from .services import services_of
from .ws_admission import admit

FORK_FIELDS = ("transport",)
"""Required in a fork's body (`session` may be left out: everything inherited)."""


class StoreUnavailable(Exception):
    pass


def _not_found(session_id: str) -> BadRequest:
    why = f"no stored live session {session_id!r} (unknown, not stored, or expired)"
    return BadRequest("session_not_found", why, "session_id", status=404)


async def _load(stored: StoredSessions | None, session_id: str) -> StoredSession:
    if stored is None:
        raise StoreUnavailable("the server is not ready yet")
    try:
        found = await stored.load(session_id)
    except (RedisError, OSError, TimeoutError) as exc:
        raise StoreUnavailable(f"stored sessions are unavailable: {exc}") from exc
    if found is None:
        raise _not_found(session_id)
    return found


async def live_session_content(request: Request) -> Response:
    services = services_of(request)
    try:
        host = request.client.host if request.client is not None else None
        with_caller(services.auth.check(request.headers.get("authorization")), host)
    except AuthError as exc:
        return error(401, "invalid_api_key", str(exc))
    session_id: str = request.path_params["session_id"]
    stored = services.live_sessions.stored
    if stored is None:
        return error(503, "not_ready", "the server is not ready yet", kind="server_error")
    try:
        pcm = await stored.recording(session_id)
    except (RedisError, OSError, TimeoutError) as exc:
        return error(503, "store_unavailable", str(exc), kind="server_error")
    if pcm is None:
        missing = _not_found(session_id)
        return error(404, missing.code, str(missing), missing.param)
    content = await asyncio.to_thread(wav, pcm)  # up to tens of MB: off the event loop
    return Response(content, media_type="audio/wav")


async def fork_live_session(request: Request) -> Response:
    """A fork over WebRTC: the stored session's config, the body's overrides, its offer."""
    services = services_of(request)
    session_id: str = request.path_params["session_id"]

    async def read(body: dict[str, Any]) -> tuple[bytes, LiveSessionConfig]:
        known(body, FORK_FIELDS, "", optional=("session",))
        offer = offer_of(body)
        overrides = parse_fork(body.get("session"), webrtc=True)
        try:
            stored = await _load(services.live_sessions.stored, session_id)
        except StoreUnavailable as exc:
            raise BadRequest("store_unavailable", str(exc), status=503) from exc
        return offer, forked(stored, overrides, webrtc=True)

    return await answer_offer(request, read)


async def live_fork(websocket: WebSocket) -> None:
    """A fork over a WebSocket: refused before the upgrade when nothing is stored."""
    admitted = await admit(websocket, websocket.headers.get("authorization"))
    if admitted is None:
        return
    grant, manager = admitted
    services = services_of(websocket)
    session_id: str = websocket.path_params["session_id"]
    try:
        stored = await _load(services.live_sessions.stored, session_id)
    except BadRequest as exc:
        await deny(websocket, exc.status, exc.code, str(exc))
        return
    except StoreUnavailable as exc:
        await deny(websocket, 503, "store_unavailable", str(exc), "server_error")
        return

    def parse(body: Any) -> LiveSessionConfig:
        return forked(stored, parse_fork(body, webrtc=False), webrtc=False)

    await serve_live(
        websocket,
        manager,
        base=SessionConfig(),
        caller=grant.caller,
        slow=services.slow_clients,
        live_sessions=services.live_sessions,
        parse=parse,
    )
