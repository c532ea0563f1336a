"""SIP call control on every worker: an app's decision on a SIP call, its transfer, or its
hang-up of a call or session, lands on any worker process, and is served by the one that
has the call (realtime/request_relay.py).

SIP is served by one worker of `parley serve --workers N` (a dialog stays in one process),
but the app's `POST /v1/realtime/calls/{id}/accept|reject|refer` and GPT-Live's
`POST /v1/live/sessions/{id}/accept|reject|refer` may go to any. A route wrapped here
(`relayed`) serves a request itself when the call is here, or when no other live process
says it has it (the call index, realtime/call_index.py, which names a ringing call before
its webhook goes out); otherwise the worker that has it serves the request through its own
app, and its answer is this one's. An owner that does not answer in time is a 503
`owner_unavailable`.

Hang-ups (`/v1/realtime/calls/{id}/hangup`, `/v1/live/sessions/{id}/hangup`) end a call or
session of any transport, so their routes first end what is here, then relay the request
the same way (`relay_hangup`) to the process their own lookup names (the call index, the
session's ownership record): its route ends it there, and its answer is this one's (503
`owner_unavailable` when none comes within `HANGUP_S`).
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
from realtime.owner_relay import FindOwner, other_live_owner
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

HANGUP_S = 5.0
"""How long a hang-up relayed to another worker waits, all told: finding the owner, its
taking the request on (within `TAKEN_S`) and its route's answer (ending a call takes well
under a second). Past it the route says 503 `owner_unavailable`. An owner that took the
hang-up on but does not answer in time goes on with it, its route bounded by the relay's
own `ANSWER_S`; what it ends closes in the call's or session's own task either way."""


class OwnerUnavailable(Exception):
    """The process that holds a hang-up's target did not answer within `within_s` (or Redis
    could not be reached): whether it ended is unknown."""

    def __init__(self, target: str, within_s: float) -> None:
        super().__init__(f"{target}'s owner did not answer within {within_s:g} s")
        self.within_s = within_s


def relayed(endpoint: Endpoint, param: str) -> Endpoint:
    """`endpoint`, served by the worker process that has the call its path names (`param`)."""

    @functools.wraps(endpoint)
    async def route(request: Request) -> Response:
        services = services_of(request)
        target: str = request.path_params[param]
        owner = await _owner_elsewhere(request, services, target)
        if owner is None:
            return await endpoint(request)
        body = await _capped_body(request)
        answer = await _served_by(services, owner, request, body)
        if answer is None:
            message = f"the server process holding {target} did not answer in time; try again"
            error = {"message": message, "type": "server_error", "param": None}
            return JSONResponse({"error": {**error, "code": "owner_unavailable"}}, 503)
        return answer

    return route


async def relay_hangup(request: Request, target: str, find_owner: FindOwner) -> Response | None:
    """A hang-up of `target`, which this process does not have, served by the live process
    that does (`find_owner` names it) through its own hangup route: that route's answer,
    within `HANGUP_S`. None when no other live process has it (the route's 404), or when
    the request was relayed here (never relayed again). Raises OwnerUnavailable."""
    services = services_of(request)
    if is_relayed(request.scope) or services.running is None or services.redis is None:
        return None
    body = await _capped_body(request)
    beat = services.running.manager.beat
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANGUP_S
    try:
        async with asyncio.timeout_at(deadline):
            owner = await other_live_owner(beat, await find_owner(target))
    except (TimeoutError, RedisError, OSError) as exc:
        log.info("hang-up of %s: its owner is unknown (%r)", target, exc)
        raise OwnerUnavailable(target, HANGUP_S) from None
    if owner is None:
        return None
    answer = await _served_by(services, owner, request, body, deadline - loop.time())
    if answer is None:
        raise OwnerUnavailable(target, HANGUP_S)
    return answer


async def _served_by(
    services: Services, owner: str, request: Request, body: bytes, within_s: float | None = None
) -> Response | None:
    """`request` with `body`, served by `owner` through its app: its answer, byte for byte;
    None when it gave none in time (`within_s`, else the relay's own bound)."""
    assert services.redis is not None and services.running is not None
    beat = services.running.manager.beat
    answer = await relay_request(services.redis, beat, owner, request.scope, body, within_s)
    if answer is None:
        return None
    return Response(answer.body, answer.status, media_type=answer.content_type)


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
            owner = await other_live_owner(beat, await running.call_index.owner(target))
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
