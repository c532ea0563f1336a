"""HTTP requests across worker processes: a request lands on any worker, what it names may not.

With `parley serve --workers N` the kernel gives an HTTP request to any worker, and what it
names may live in another: the SIP call an app decides on or transfers
(`/v1/realtime/calls/{id}/accept|reject|refer`, `/v1/live/sessions/{id}/accept|reject|refer`)
rings or talks in the one worker whose sockets carry it, and the call or session a hang-up
ends (`/v1/realtime/calls/{id}/hangup`, `/v1/live/sessions/{id}/hangup`) in one too. The
worker that took the request (the taker) hands it to that worker (the owner), which
serves it as if it had landed there, through its own ASGI app, and the taker answers with
the owner's answer (status, Content-Type, body), byte for byte. The owner is reached as
every relay reaches it (owner_relay.py):

1. The taker subscribes to a fresh answer channel, then sends the request through the
   owner's mailbox (told, `OP`): the method, the path, the headers that matter
   (`FORWARDED`) and the body (base64, at most `MAX_BODY_BYTES`: the routes' own cap and
   one byte, so the owner refuses a body over it in its own words).
2. The owner publishes `TAKEN` on the channel, runs the request through its app (the scope
   says `RELAYED`, so it is never relayed again), then publishes the answer (JSON).
3. The taker waits `TAKEN_S` for `TAKEN` (the owner is alive but silent otherwise), then up
   to `ANSWER_S` for the answer while the owner beats (a transfer waits for the caller's
   side, which may take a while; a dead owner does not keep it waiting), all within the
   caller's bound (`within_s`: a hang-up's route gives it 5 s in all). No answer is
   `None`: the route says 503 `owner_unavailable`.

Nothing is unbounded: the request and the answer are capped (`MAX_ANSWER_BYTES`), the
taker's wait has its deadline, and the owner's side runs in the mailbox's own task for the
request (no task of its own), its app within `ANSWER_S` (a taker that gave up sooner, a
hang-up's, leaves the owner's route to finish within it; its answer then goes unread).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message

from sessions.keys import NAMESPACE
from sessions.process_beat import ProcessBeat, Request

from .owner_relay import RelayListener, new_relay_id, relay_channel

log = logging.getLogger("parley.realtime.request_relay")

OP = "request_relay"
TAKEN = "taken"
RELAYED = "parley.relayed"
"""The ASGI scope key that marks a request the owner serves for another worker."""
FORWARDED = ("authorization", "content-type", "content-length")
"""The headers the relayed routes read (Content-Length: so a body over the cap is refused
in the same words)."""
MAX_BODY_BYTES = 1024 * 1024 + 1
"""The routes' cap on a body (1 MiB) and one byte more: enough for the owner to see a body
over the cap, never a bigger message."""
MAX_ANSWER_BYTES = 64 * 1024
"""Call control answers a few hundred bytes of JSON at most."""
TAKEN_S = 3.0
"""How long the taker waits for the owner to take the request on."""
ANSWER_S = 75.0
"""How long the taker waits for the answer while the owner beats: past the slowest route,
a transfer (its REFER waits up to 64 T1 for the answer's ACK, then as long for its own
answer: 64 s at the default T1 of 500 ms)."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes = b""
    content_type: str | None = None

    def to_json(self) -> str:
        body = base64.b64encode(self.body).decode()
        return json.dumps({"status": self.status, "type": self.content_type, "body": body})

    @classmethod
    def from_json(cls, text: str) -> Answer:
        """Raises ValueError (KeyError, TypeError included) for anything else."""
        try:
            raw = json.loads(text)
            kind = raw["type"]
            return cls(int(raw["status"]), base64.b64decode(raw["body"]), kind and str(kind))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a relayed answer: {exc}") from None


def answer_channel(relay_id: str, namespace: str = NAMESPACE) -> str:
    return relay_channel("request-relay", relay_id, namespace)


def is_relayed(scope: Any) -> bool:
    """Whether a request is one the owner serves for another worker (never relayed again)."""
    return bool(scope.get(RELAYED))


async def relay_request(
    redis: aioredis.Redis,
    beat: ProcessBeat,
    owner: str,
    scope: Any,
    body: bytes,
    within_s: float | None = None,
) -> Answer | None:
    """The taker's side: have `owner` serve the request of `scope` (an HTTP scope) with
    `body`; its answer, or None when it did not give one in time (`within_s` in all, else
    `TAKEN_S` and `ANSWER_S`)."""
    headers = [
        [name.decode("latin-1"), value.decode("latin-1")]
        for name, value in scope["headers"]
        if name.decode("latin-1").lower() in FORWARDED
    ]
    relay_id = new_relay_id()
    request = {
        "op": OP,
        "relay": relay_id,
        "method": scope["method"],
        "path": scope["path"],
        "query": scope.get("query_string", b"").decode("latin-1"),
        "headers": headers,
        "body": base64.b64encode(body[:MAX_BODY_BYTES]).decode(),
    }
    try:
        bound_s = TAKEN_S + ANSWER_S if within_s is None else within_s
        async with asyncio.timeout(bound_s), RelayListener(redis, beat, owner) as listener:
            if not await listener.reach(answer_channel(relay_id), request):
                return None
            if await listener.next(TAKEN_S) != TAKEN:
                return None
            async with asyncio.timeout(ANSWER_S):
                said = await listener.heard()
            return None if said is None else Answer.from_json(said)
    except TimeoutError:
        pass
    except ValueError as exc:
        log.warning(
            "%s %s: %s's answer is unreadable: %s", scope["method"], scope["path"], owner, exc
        )
    except (RedisError, OSError) as exc:
        log.warning("%s %s not relayed to %s: %s", scope["method"], scope["path"], owner, exc)
    return None


class RequestRelays:
    """The owner's side: serves other workers' relayed requests through this process's app."""

    def __init__(self, redis: aioredis.Redis, app: ASGIApp) -> None:
        self._redis = redis
        self._app = app

    async def on_request(self, request: Request) -> None:
        """Another worker hands a request here (`OP`); runs in the mailbox's task for it."""
        relay_id = str(request.get("relay", ""))
        if not relay_id:
            return
        channel = answer_channel(relay_id)
        await self._redis.publish(channel, TAKEN)
        try:
            answer = await serve(self._app, request)
        except ValueError as exc:  # a malformed relay: no Parley process sends one
            log.warning("relayed request refused: %s", exc)
            answer = Answer(400)
        await self._redis.publish(channel, answer.to_json())


async def serve(app: ASGIApp, request: Request) -> Answer:
    """Run a relayed request through `app`, as if it had come in over HTTP: its answer."""
    try:
        body = base64.b64decode(str(request["body"]), validate=True)
        headers = [
            (str(k).encode("latin-1"), str(v).encode("latin-1")) for k, v in request["headers"]
        ]
        path = str(request["path"])
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": str(request["method"]),
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": str(request.get("query", "")).encode("latin-1"),
            "headers": headers,
            "client": None,
            "server": None,
            "state": {},
            RELAYED: True,
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"a relayed request without {exc}") from None
    return await _Exchange(body).run(app, scope)


class _Exchange:
    """One request's ASGI channel: the body in, the answer collected (capped)."""

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body
        self._done = asyncio.Event()
        self.status: int | None = None
        self.content_type: str | None = None
        self.chunks = bytearray()
        self.too_large = False

    async def run(self, app: ASGIApp, scope: dict[str, Any]) -> Answer:
        try:
            async with asyncio.timeout(ANSWER_S):  # the taker waits no longer
                await app(scope, self._receive, self._send)
        except TimeoutError:
            log.warning(
                "relayed %s %s: no answer in %g s", scope["method"], scope["path"], ANSWER_S
            )
        except Exception:
            log.exception("relayed %s %s failed", scope["method"], scope["path"])
        if self.status is None:
            return _error(500, "relayed_request_failed", "the request failed on its server")
        if self.too_large:
            message = f"the answer was over {MAX_ANSWER_BYTES} bytes"
            return _error(502, "relayed_answer_too_large", message)
        return Answer(self.status, bytes(self.chunks), self.content_type)

    async def _receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._done.wait()  # as a client that waits for its answer, then goes
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            for name, value in message.get("headers", []):
                if name.lower() == b"content-type":
                    self.content_type = value.decode("latin-1")
        elif message["type"] == "http.response.body":
            if not self.too_large:
                self.chunks += message.get("body", b"")
            if len(self.chunks) > MAX_ANSWER_BYTES:
                self.too_large = True
                self.chunks.clear()
            if not message.get("more_body", False):
                self._done.set()


def _error(status: int, code: str, message: str) -> Answer:
    error = {"message": message, "type": "server_error", "param": None, "code": code}
    return Answer(status, json.dumps({"error": error}).encode(), "application/json")
