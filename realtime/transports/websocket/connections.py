"""The connections of one process by session, for resuming a session after a drop.

Both WebSocket endpoints (OpenAI Realtime, vLLM-Omni's video chat) keep their sessions
alive for `DEFAULT_GRACE_S` after a dropped connection; a clean close (the client's close
frame with 1000 or 1001) ends the session at once. A client that reconnects with the
session id and resume token asks the endpoint's `ConnectionRegistry` for the connection
that last served the session: to take the session over from it (a half-open socket the
server has not noticed yet) and to carry on with its settings.

A resume may reach any process. The registries are per process; a session that is not
here is resumed from Redis (`SessionManager.resume`: the old owner, if alive, lets go, and
this process owns the session from then on). There is no old connection then: what the
transport needs of it (the client's audio formats, the stream's settings) comes from the
session record (`Session.transport`, written by the transport with
`SessionStore.write_transport`).

Hand-over (a drain, or another process took the session): the session ends here without a
goodbye, and its connection tells the client to reconnect (an `error` with code
`MOVED_CODE` or `DRAINING_CODE`, then close 1012, service restart): connection.py. To
drain a process: `await manager.hand_over_all()`; the connections of every endpoint
(OpenAI Realtime, the video chat stream) follow their sessions by themselves.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from redis.exceptions import RedisError
from starlette import status

from sessions import Session, SessionManager, SessionNotFoundError
from sessions.manager import DRAINING, MOVED

DEFAULT_GRACE_S = 30.0
"""How long a session outlives its dropped connection, waiting for a resume."""

CLEAN_CLOSE_CODES = frozenset({status.WS_1000_NORMAL_CLOSURE, status.WS_1001_GOING_AWAY})
"""Close codes that mean the client ended the connection on purpose: its session ends at
once. Only a close frame the client sent carries one of these. uvicorn reports a dropped
TCP connection (no close frame) as 1005 with its default, sans-I/O websockets protocol
and as 1006 with the others; a half-open socket caught by the keepalive ping shows up
the same way (or as 1011); a close frame with no code is 1005 too. None of those is
clean: the session waits `DEFAULT_GRACE_S` for a resume."""

CLOSE_SERVICE_RESTART = status.WS_1012_SERVICE_RESTART
"""The close code of a session handed over: reconnect (with the resume token)."""
MOVED_CODE = MOVED
DRAINING_CODE = DRAINING
HANDED_OVER = frozenset({MOVED_CODE, DRAINING_CODE})
"""Why a session ended here to go on elsewhere (the session's close reason)."""


def reconnect_text(code: str, session_id: str) -> str:
    """What a client told to reconnect reads."""
    why = (
        "this server is shutting down"
        if code == DRAINING_CODE
        else "another server process took it over"
    )
    return (
        f"The session {session_id} moved ({why}): reconnect with its session_id, "
        "resume_token and last_event_id to resume it; nothing is lost"
    )


CLOSE_VERDICT_S = 1.0
"""How long a connection whose send failed waits for the reader to report the client's
close frame (a clean close races the last send) before it treats the end as a drop."""


def closed_cleanly(code: object) -> bool:
    """Whether a `websocket.disconnect` code says the client closed on purpose."""
    return code in CLEAN_CLOSE_CODES


class Resumable(Protocol):
    @property
    def session(self) -> Session | None: ...

    async def take_over(self) -> None:
        """Another connection resumes this one's session: end this one (detaching the
        session), and return once that is done."""
        ...


C = TypeVar("C", bound=Resumable)


class ConnectionRegistry(Generic[C]):
    """Per process: the connection that last served each session, live or dropped."""

    def __init__(self) -> None:
        self._by_session: dict[str, C] = {}

    def __len__(self) -> int:
        return len(self._by_session)

    def get(self, session_id: str) -> C | None:
        return self._by_session.get(session_id)

    def register(self, connection: C) -> None:
        """`connection` serves its session from now on; entries of closed sessions go."""
        session = connection.session
        assert session is not None
        for session_id, old in list(self._by_session.items()):
            if old.session is None or old.session.closed:
                del self._by_session[session_id]
        self._by_session[session.session_id] = connection

    def discard(self, connection: C) -> None:
        """Forget `connection` (its session has ended), unless another one took over."""
        session = connection.session
        if session is not None and self._by_session.get(session.session_id) is connection:
            del self._by_session[session.session_id]


async def claim_session(
    manager: SessionManager,
    registry: ConnectionRegistry[C],
    session_id: str,
    token: str | None,
    *,
    caller: str | None = None,
) -> tuple[Session, C | None] | None:
    """For a resume: the live session `session_id` if `token` is its resume token, and the
    connection that last served it, which has handed the session over by now (a half-open
    socket the server had not noticed yet); None when there is nothing to resume. A
    session another process holds (or held, if it died) is taken over from Redis, with no
    old connection, counted against `caller` from now on. Raises SessionLimitError when this
    process takes no session now."""
    session = resumable_session(manager, session_id, token)
    if session is not None and await manager.let_go_if_lost(session_id):
        session = None  # a stale copy: the session lives on elsewhere, taken back below
    if session is None:
        try:
            resumed = await manager.resume(session_id, token, caller=caller)
        except (RedisError, OSError):  # RedisUnavailableError is an OSError
            return None
        return (resumed, None) if resumed is not None else None
    old = registry.get(session_id)
    if old is not None:
        await old.take_over()  # its teardown (a detach, maybe) ends before we attach
    return session, old


def resumable_session(
    manager: SessionManager, session_id: str, token: str | None
) -> Session | None:
    """The live session `session_id` if `token` is its resume token, else None."""
    try:
        session = manager.get(session_id)
    except SessionNotFoundError:
        return None
    if token is None or not session.matches_token(token) or session.closed:
        return None
    return session
