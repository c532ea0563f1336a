"""SIP call control on every worker: an app's decision on a SIP call, or its transfer, lands
on any worker process, and is served by the one that has the call (realtime/request_relay.py).

SIP is served by one worker of `parley serve --workers N` (a dialog stays in one process),
but the app's `POST /v1/realtime/calls/{id}/accept|reject|refer` and GPT-Live's
`POST /v1/live/sessions/{id}/accept|reject|refer` may go to any. A route wrapped here
(`relayed`) serves a request itself when the call is here, or when no other live process
says it has it (the call index, realtime/call_index.py, which names a ringing call before
its webhook goes out); otherwise the worker that has it serves the request through its own
app, and its answer is this one's. An owner that does not answer in time is a 503
`owner_unavailable`, as a relayed hang-up's is. (Hang-ups have their own relay, which ends
a session on any transport: hangup_relay.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from realtime.auth import AuthError
from realtime.request_relay import (
    MAX_BODY_BYTES,
    OP,
    TAKEN_S,
    RequestRelays,
    is_relayed,
    relay_request,
)

from .services import Running, Services, services_of

log = logging.getLogger("parley.web.call_controls")

Endpoint = Callable[[Request], Awaitable[Response]]


def relayed(endpoint: Endpoint, param: str) -> Endpoint:
    """`endpoint`, served by the worker process that has the call its path names (`param`)."""

    @functools.wraps(endpoint)
    async def route(request: Request) -> Response:
        services = services_of(request)
        target: str = request.path_params[param]
        owner = await _owner_elsewhere(request, services, target)
        if owner is None:
            return await endpoint(request)
        assert services.redis is not None and services.running is not None
        body = await _capped_body(request)
        beat = services.running.manager.beat
        answer = await relay_request(services.redis, beat, owner, request.scope, body)
        if answer is None:
            message = f"the server process holding {target} did not answer in time; try again"
            error = {"message": message, "type": "server_error", "param": None}
            return JSONResponse({"error": {**error, "code": "owner_unavailable"}}, 503)
        return Response(answer.body, answer.status, media_type=answer.content_type)

    return route


async def _owner_elsewhere(request: Request, services: Services, target: str) -> str | None:
    """The live process that has `target` when it is not this one; None to serve it here
    (a relayed request, a refused key, a call here, or one no other process has)."""
    running = services.running
    if is_relayed(request.scope) or running is None or running.call_index is None:
        return None
    try:
        services.auth.check_key(request.headers.get("authorization"))
    except AuthError:
        return None  # the route refuses it in its own words
    if target in running.call_ids() or services.live_sessions.get(target) is not None:
        return None
    beat = running.manager.beat
    try:
        async with asyncio.timeout(TAKEN_S):
            owner = await running.call_index.owner(target)
            if owner is None or owner == beat.process_id or not await beat.alive(owner):
                return None
    except (TimeoutError, RedisError, OSError) as exc:
        log.info("call %s: its owner is unknown (%s): served here", target, exc)
        return None
    return owner


async def _capped_body(request: Request) -> bytes:
    """The body as the route would read it, up to the relay's cap (the owner's route then
    refuses one over its own)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) >= MAX_BODY_BYTES:
        return b""  # refused for its declared length alone
    body = bytearray()
    async with contextlib.aclosing(request.stream()) as chunks:
        async for chunk in chunks:
            body += chunk
            if len(body) >= MAX_BODY_BYTES:
                break
    return bytes(body[:MAX_BODY_BYTES])


def serve_call_controls(services: Services, running: Running, app: ASGIApp) -> None:
    """Serve the call-control requests other workers relay here, through `app` (with Redis)."""
    if services.redis is not None:
        running.manager.serve_requests(OP, RequestRelays(services.redis, app).on_request)
