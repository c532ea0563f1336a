"""Which web pages may use this server: an Origin allowlist for WebSockets and signaling, and CORS.

A browser sends `Origin` on every WebSocket handshake and on every POST, for whatever page the
user has open. Without this check any site could start sessions on a keyless loopback server
(cross-site WebSocket hijacking); and since a `text/plain` or multipart offer is a "simple"
request, a browser would even POST one to `/v1/realtime/calls` without asking first. Clients
that send no Origin (SDKs, phones, other servers) are not a browser acting for some page: they
pass, and authenticate by key where one is set.

The server's own origin always passes (the demo page at / comes from it): the address it was
configured with (`--host`/`--port`; a loopback host under each loopback name) and the address a
connection arrived at (which covers `--port 0` and wildcard hosts). The Host header is never
trusted for this: a DNS-rebinding page chooses it.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

from starlette import status
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from realtime.transports.webrtc.ice import is_loopback

from .origin_names import ANY_ORIGIN, bracketed, normalize_origin
from .settings import Settings

log = logging.getLogger("parley.web.origins")

SIGNALING_PREFIX = "/v1/"
"""Every HTTP endpoint under it is signaling: checked, and open to CORS for allowed origins."""
ALLOWED_METHODS = "POST"
BASE_ALLOWED_HEADERS = ("Authorization", "Content-Type")
EXPOSED_HEADERS = "Location"
"""The call's URL (for its hang-up) is read from the answer's Location."""
PREFLIGHT_MAX_AGE_S = 600
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


@functools.lru_cache(maxsize=64)
def own_origins(scheme: str, host: str, port: int | None) -> frozenset[str]:
    """The origins of pages this server itself serves at `host:port`."""
    host = host.strip("[]").lower()
    if host in WILDCARD_HOSTS or not port:
        return frozenset()
    hosts = {host, *LOOPBACK_NAMES} if is_loopback(host) else {host}
    return frozenset(normalize_origin(f"{scheme}://{bracketed(name)}:{port}") for name in hosts)


def _arrival_origins(scope: Scope) -> frozenset[str]:
    """The own origins of the address this connection arrived at (not the Host it names)."""
    server = scope.get("server")
    if not server or not isinstance(server[0], str) or not isinstance(server[1], int):
        return frozenset()  # a unix socket: no page can come from it
    scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
    return own_origins(scheme, server[0], server[1])


@dataclass(frozen=True, slots=True)
class OriginAllowlist:
    """The origins whose pages may use this server, besides the one it is reached at."""

    origins: frozenset[str]
    any_origin: bool = False
    """`*`: every origin (only with an API key: then a page needs a key or secret anyway)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> OriginAllowlist:
        listed = [o for o in settings.allowed_origins if o != ANY_ORIGIN]
        configured = frozenset(normalize_origin(origin) for origin in listed)
        return cls(
            configured | own_origins("http", settings.host, settings.port),
            any_origin=ANY_ORIGIN in settings.allowed_origins,
        )

    def allows(self, origin: str, scope: Scope) -> bool:
        if self.any_origin:
            return True
        try:
            canonical = normalize_origin(origin)
        except ValueError:  # `null` (sandboxed frames, file: pages) or garbage
            return False
        return canonical in self.origins or canonical in _arrival_origins(scope)


class OriginPolicy:
    """ASGI middleware: refuse foreign pages on every WebSocket and on signaling; CORS for the
    allowed ones on signaling. Requests without an Origin pass untouched."""

    def __init__(self, app: ASGIApp, allowlist: OriginAllowlist) -> None:
        self.app = app
        self.allowlist = allowlist

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            origin = Headers(scope=scope).get("origin")
            if origin is not None and not self.allowlist.allows(origin, scope):
                await _refuse_websocket(scope, receive, send, origin)
                return
        elif scope["type"] == "http" and scope["path"].startswith(SIGNALING_PREFIX):
            await self._signaling(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _signaling(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        if not self.allowlist.allows(origin, scope):
            log.debug("refused %s %s from origin %s", scope["method"], scope["path"], origin)
            await _forbidden(origin)(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await _preflight(origin, headers)(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                response_headers = MutableHeaders(scope=message)
                response_headers["Access-Control-Allow-Origin"] = origin
                response_headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
                response_headers.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _forbidden(origin: str) -> Response:
    message = (
        f"web pages from {origin} may not use this server "
        "(its operator can allow them with --allowed-origins)"
    )
    body = {
        "error": {"type": "invalid_request_error", "code": "origin_not_allowed", "message": message}
    }
    return JSONResponse(body, 403, headers={"Vary": "Origin"})


def _preflight(origin: str, headers: Headers) -> Response:
    """204 for an allowed origin's preflight. The headers it asks for are granted (the openai
    JS SDK adds its own `x-stainless-*` ones), beside Authorization and Content-Type."""
    allowed = list(BASE_ALLOWED_HEADERS)
    requested = headers.get("access-control-request-headers", "")
    for name in (part.strip() for part in requested.split(",")):
        if _HEADER_NAME.match(name) and name.lower() not in {a.lower() for a in allowed}:
            allowed.append(name)
    return Response(
        status_code=204,
        headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": ALLOWED_METHODS,
            "Access-Control-Allow-Headers": ", ".join(allowed),
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
            "Vary": "Origin",
        },
    )


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send, origin: str) -> None:
    """403 before the upgrade where the server can send one, else a close with 1008."""
    log.debug("refused a WebSocket to %s from origin %s", scope["path"], origin)
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await _forbidden(origin)(scope, receive, send)
    else:
        await send(
            {
                "type": "websocket.close",
                "code": status.WS_1008_POLICY_VIOLATION,
                "reason": "origin_not_allowed",
            }
        )
