"""One lifecycle for every message transport over a WebSocket: one connection, one session.

The protocols over a WebSocket (OpenAI Realtime: realtime/openai/websocket.py; vLLM-Omni's
video chat: realtime/video_chat/video_stream.py; Twilio's and GPT-Live's) differ in their
messages only. Everything else is here, once:

- The reader: one task, so client messages are applied in the order they were sent. It
  waits while the outbound queue is half full (`PacedSender.input_room`), so a burst of
  messages that each get a reply cannot fill it; a message over `MAX_MESSAGE_BYTES`
  closes the connection with 1009; the client's close frame with 1000 or 1001 is a clean
  close (connections.py), anything else a drop.
- The sender: the PacedSender's one ordered, paced queue. A client that stops reading for
  `SlowClients.stall_s` is closed with 1008 and its session ends (slow_clients.py); a send
  that fails means the client has gone, unless the reader is about to see its close frame
  (`CLOSE_VERDICT_S`).
- `finish(reason, code)`: the one way a connection ends; the first reason wins. `code` is
  the close frame we send, None when there is nobody to send it to.
- Teardown, in order: the reader stops; an end that is not resumable closes the session,
  whose goodbye (queued by then) goes out before a normal close (`FLUSH_TIMEOUT_S`); the
  sender stops; the socket closes; a resumable end detaches the session, which then waits
  `grace_s` for a resume.
- Event ids: a message that no session event produced (audio, a `pong`) is named at send
  time after the last event's message sent before it, `<that id>~<n>`; a resume can start
  right there (resume.py).
- Resume: `resume_into()` holds live events while the sender first sends what the client
  missed (the session's log replayed through the connection's own, fresh mapping), then
  the held ones, each exactly once. `take_over()` ends this connection for another that
  resumes its session, and returns once the session is detached.
- Hand-over: a session that ends here to go on in another process (connections.py) ends
  its connection with an `error` (`session_moved` or `server_draining`, named like a
  message of our own, `<last id>~<n>`, so a resume from it starts right after what the
  client saw) and close 1012. What a resume elsewhere needs of the connection
  (`transport_state()`) is kept in the session record at the start and at a drop.

A protocol is a message mapping on top: `messages()` (a session event -> wire messages, for
the live stream and a replay alike), `handle()` (one client message), `error_message()`,
and `RESUMABLE`: which ends leave the session waiting for a resume. A connection that does
not own its session (`OWNS_SESSION = False`: a sideband on a WebRTC call, whose session is
the call's) just ends: the session goes on, untouched.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from typing import Any, ClassVar, Self

from starlette import status
from starlette.websockets import WebSocket, WebSocketDisconnect

from pipeline.tasks import TaskSet, cancel_and_wait
from sessions import Session, SessionClosedError, SessionManager
from sessions.events import Event, SessionClosed

from ...openai.resume import HELD_EVENTS, read_log, replay_messages
from ...slow_clients import CLOSE_TOO_SLOW, DEFAULT_SLOW_CLIENTS, TOO_SLOW, SlowClients
from .connections import (
    CLOSE_SERVICE_RESTART,
    CLOSE_VERDICT_S,
    DEFAULT_GRACE_S,
    HANDED_OVER,
    ConnectionRegistry,
    closed_cleanly,
    reconnect_text,
)
from .sender import AudioMessageFn, Message, PacedSender, SlowClientError

log = logging.getLogger("parley.realtime.websocket.connection")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest client message: a big image or a few seconds of audio, base64."""
FLUSH_TIMEOUT_S = 2.0
"""How long the goodbye (and what precedes it) may take to go out before the close."""

SOCKET_ERRORS = (WebSocketDisconnect, RuntimeError, OSError)
"""What a send or receive raises once the client is gone."""

CLOSE_NORMAL = status.WS_1000_NORMAL_CLOSURE
CLOSE_GOING_AWAY = status.WS_1001_GOING_AWAY
CLOSE_POLICY = status.WS_1008_POLICY_VIOLATION
CLOSE_TOO_BIG = status.WS_1009_MESSAGE_TOO_BIG
CLOSE_INTERNAL_ERROR = status.WS_1011_INTERNAL_ERROR
CLOSE_TRY_AGAIN = status.WS_1013_TRY_AGAIN_LATER

CLIENT_CLOSED = "client_closed"
CLIENT_GONE = "client_gone"
TAKEN_OVER = "taken_over"
SESSION_CLOSED = "session_closed"
MESSAGE_TOO_BIG = "message_too_big"
SERVER_ERROR = "server_error"
SERVER_SHUTDOWN = "server_shutdown"


def with_id(message: Message, event_id: str) -> Message:
    """`message` with its `event_id` (right after its type)."""
    body = dict(message)
    out: Message = {"type": body.pop("type"), "event_id": event_id}
    out.update(body)
    return out


class MessageConnection(PacedSender):
    """A WebSocket bound to one session: the session's output sink, the client's reader."""

    RESUMABLE: ClassVar[frozenset[str]] = frozenset({CLIENT_GONE, TAKEN_OVER})
    """Why a connection ended that leaves its session waiting for a resume; any other end
    closes the session with that reason."""
    TRANSPORT: ClassVar[str] = "websocket"
    """The transport's name in logs and metrics."""
    SAYS_WHY: ClassVar[bool] = True
    """Whether the close frame carries the reason."""
    OWNS_SESSION: ClassVar[bool] = True
    """Whether the connection's end ends (or detaches) its session; False for a second
    reader of a session that another transport serves."""

    def __init__(
        self,
        websocket: WebSocket,
        manager: SessionManager,
        audio_message: AudioMessageFn,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
        output_rate: int | None = None,
    ) -> None:
        """`output_rate`: the rate the client hears (its audio resampled once, as a
        stream); None: each piece at the rate the session wrote it."""
        super().__init__(
            self._send_message, audio_message, stall_s=slow.stall_s, sample_rate=output_rate
        )
        self.slow = slow
        self.websocket = websocket
        self.manager = manager
        self.grace_s = grace_s
        """How long the session outlives a dropped connection, for a resume."""
        self.session: Session | None = None
        self.close_reason = ""
        self.close_code: int | None = CLOSE_NORMAL
        """The close frame we send at the end; None when the client has gone already."""
        self._end = asyncio.Event()
        self._done = asyncio.Event()
        self._socket_closed = False
        self._session_ended = False
        self._held: collections.deque[Event] | None = None
        self._resume_from: tuple[str | None] | None = None
        """(the client's last event id,) while a resume's catch-up is due."""
        self._last_id = "evt"
        """The last id sent that a session event gave (`evt` until there is one)."""
        self._seq = 0
        self._remembered: dict[str, Any] | None = None

    # --- the protocol's part -------------------------------------------------------------

    def messages(self, event: Event) -> list[tuple[Message, bool]]:
        """The wire messages of a session event, in order, each with its `after_audio` flag
        (an end of an answer never overtakes that answer's audio). Called for live events
        and, on a resume, for every logged one, so the mapping's state ends up as live."""
        raise NotImplementedError

    def observe(self, event: Event) -> None:
        """What a live event says beyond its messages (replayed ones included)."""

    async def handle(self, raw: str | bytes) -> bool:
        """Apply one client message; True when the client is done (after `finish`)."""
        raise NotImplementedError

    def error_message(self, code: str, text: str) -> Message:
        """The protocol's `error` message of the connection's own."""
        raise NotImplementedError

    def on_close(self) -> None:
        """The connection is ending: no more output of the protocol's own (a summary of
        throttled errors, say)."""

    def resume_failed_text(self) -> str:
        return "The missed messages could not be read"

    def reconnect_message(self, code: str, text: str) -> Message:
        """The `error` that tells the client its session moved (to reconnect)."""
        return self.error_message(code, text)

    def transport_state(self) -> dict[str, Any] | None:
        """What a resume on another process needs of this connection (kept in the
        session record); None: nothing."""
        return None

    async def remember_transport(self) -> None:
        """Keep `transport_state()` in the session record, when it changed."""
        session, state = self.session, self.transport_state()
        if session is None or state is None or state == self._remembered:
            return
        self._remembered = state
        try:
            await session.store.write_transport(state)
        except Exception as exc:  # a resume elsewhere then uses the defaults
            log.warning("session %s: transport state not kept: %r", session.session_id, exc)

    def resume_gap_text(self, last_event_id: str | None) -> str:
        return (
            f"Event {last_event_id} is no longer in the session's log; every message still "
            "logged follows (drop those you have by event_id)"
        )

    # --- OutputSink ----------------------------------------------------------------------

    def event(self, event: Event) -> None:
        if self._held is not None:
            self._held.append(event)
        else:
            self._emit(event)

    def _emit(self, event: Event, *, replayed: bool = False) -> None:
        """Queue the event's messages (unless a replay sent them already), and note what
        it says."""
        if isinstance(event, SessionClosed) and event.reason in HANDED_OVER:
            self._moved(event.reason)
            return
        if not replayed:
            for message, after_audio in self.messages(event):
                self.post(message, after_audio=after_audio)
        self.observe(event)
        if isinstance(event, SessionClosed):  # the close frame says why it ended
            self.finish(event.reason or SESSION_CLOSED)

    def _moved(self, code: str) -> None:
        """The session went on elsewhere: the client is told to reconnect, then 1012."""
        message = dict(self.reconnect_message(code, reconnect_text(code, self._session_id or "")))
        message.pop("event_id", None)  # named after the last message sent (`<id>~<n>`)
        self.post(message)
        self.finish(code, CLOSE_SERVICE_RESTART)

    # --- the wire ------------------------------------------------------------------------

    async def _send_message(self, message: Message) -> None:
        event_id = message.get("event_id")
        if event_id is None:  # no session event behind it: named after the last one sent
            self._seq += 1
            message = with_id(message, f"{self._last_id}~{self._seq}")
        elif "~" not in event_id:
            self._last_id = event_id
        await self.websocket.send_text(json.dumps(message, separators=(",", ":")))

    async def say(self, message: Message) -> None:
        """A message of the connection's own: queued once a session is bound, else sent
        at once (a client that has gone then ends the connection)."""
        if self.session is not None:
            self.post(message)
            return
        try:
            await self._send_message(message)
        except SOCKET_ERRORS:
            self.finish(CLIENT_GONE, None)

    async def receive(self) -> str | bytes | None:
        """The next client message; None once the connection is to end (the client left,
        or sent more than `MAX_MESSAGE_BYTES` at once)."""
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                code = message.get("code")
                self.finish(CLIENT_CLOSED if closed_cleanly(code) else CLIENT_GONE, None)
                return None
            raw: str | bytes | None = message.get("text")
            if raw is None:
                raw = message.get("bytes")
            if raw is None:
                continue
            size = len(raw)
            if isinstance(raw, str) and size > MAX_MESSAGE_BYTES // 4:
                size = len(raw.encode())  # only a long text can be too long in bytes
            if size > MAX_MESSAGE_BYTES:
                self.finish(MESSAGE_TOO_BIG, CLOSE_TOO_BIG)
                return None
            return raw

    # --- the connection's life -----------------------------------------------------------

    def finish(self, reason: str, code: int | None = CLOSE_NORMAL) -> None:
        """End the connection (not necessarily the session); the first reason wins."""
        if not self._end.is_set():
            self.close_reason, self.close_code = reason, code
            self._end.set()

    @property
    def resumable(self) -> bool:
        """Whether the connection ended in a way that leaves the session for a resume."""
        return self.close_reason in self.RESUMABLE

    def resume_into(self, session: Session, last_event_id: str | None) -> None:
        """Serve `session` (a resumed one) from now on: live events wait until `serve()`
        has sent what the client missed after `last_event_id`. Raises SessionClosedError
        when the session has just ended."""
        self._held = collections.deque(maxlen=HELD_EVENTS)
        session.attach(self)
        self.session = session
        self._resume_from = (last_event_id,)
        # Messages of our own before the first replayed one are named after what the
        # client saw last, so resuming from one of them again starts at the same place.
        anchor, _, seq = (last_event_id or "evt").partition("~")
        self._last_id, self._seq = anchor, int(seq) if seq.isdigit() else 0

    async def take_over(self) -> None:
        """Another connection resumes this one's session: end this one (detaching the
        session), and return once that is done."""
        self.finish(TAKEN_OVER)
        await self._done.wait()

    async def serve(self, registry: ConnectionRegistry[Self] | None) -> None:
        """Run until the client leaves, the session ends or another connection takes it
        over, then tear down in order. `registry` knows the connection meanwhile (and
        after, while its session waits for a resume); None for a connection that cannot be
        resumed."""
        session = self.session
        assert session is not None
        if registry is not None:
            registry.register(self)
        if self.OWNS_SESSION and self.transport_state() is not None:
            session.movable = True  # a drain hands it over: the client can resume it
            await self.remember_transport()
        name = session.session_id
        tasks = TaskSet(f"{name}:ws")
        try:
            # Not a TaskGroup: the reader stops first, and the sender may still have the
            # goodbye to send after it; each stops at its own step below.
            reader = tasks.create_task(self._read(), name=f"{name}:ws-in")
            sender = tasks.create_task(self._run_sender(), name=f"{name}:ws-out")
            await self._end.wait()
            await cancel_and_wait(reader)
            if not self.resumable or not self.OWNS_SESSION:
                if self.OWNS_SESSION:
                    await self._end_session(session)  # its goodbye is queued now
                flush = self.close_code in (CLOSE_NORMAL, CLOSE_SERVICE_RESTART)
                if flush and not sender.done():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(FLUSH_TIMEOUT_S):
                            await self.flushed()
        finally:
            self.finish(SERVER_SHUTDOWN, CLOSE_GOING_AWAY)  # when the route itself was cancelled
            await tasks.close()
            self.close()
            self.on_close()
            await self.close_socket()
            if self.OWNS_SESSION:
                await self._leave(session)
            if registry is not None and not self.resumable:
                registry.discard(self)
            self._done.set()

    async def close_socket(self) -> None:
        """Send the close frame (unless the client has gone). Idempotent."""
        if self._socket_closed:
            return
        self._socket_closed = True
        if self.close_code is None:
            return  # nothing to say goodbye to (and 1005/1006 are never sent)
        reason = self.close_reason[:120] if self.SAYS_WHY else ""
        # A client that does not read may block the close frame too: returning from the
        # route closes the transport anyway.
        with contextlib.suppress(*SOCKET_ERRORS, TimeoutError):
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                await self.websocket.close(self.close_code, reason)

    async def _end_session(self, session: Session) -> None:
        """Close the session with the connection's reason, once."""
        if not self._session_ended:
            self._session_ended = True
            await self.manager.close_session(session.session_id, self.close_reason)

    async def _leave(self, session: Session) -> None:
        """Close the session, or leave it to wait for a resume when the client may come
        back (it dropped, or a resume took over: the answer in progress writes to this
        closed sink, so it is stopped, and the new connection attaches to a quiet session)."""
        if not self.resumable:
            await self._end_session(session)
            return
        await self.remember_transport()
        try:
            await session.detach(self.grace_s)
        except SessionClosedError:
            return
        log.info(
            "session %s: connection ended (%s); resumable for %g s",
            session.session_id,
            self.close_reason,
            self.grace_s,
        )

    # --- the tasks -----------------------------------------------------------------------

    async def _run_sender(self) -> None:
        """On a resume, what the client missed first; then the live output. Meanwhile the
        reader may already apply new messages: their output waits."""
        try:
            if self._resume_from is not None:
                (last_event_id,), self._resume_from = self._resume_from, None
                await self._catch_up(last_event_id)
            await self.run()
        except SlowClientError as exc:
            self._too_slow(exc)
        except SOCKET_ERRORS:
            # The reader may be about to see the client's close frame: its verdict wins.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_VERDICT_S):
                    await self._end.wait()
            self.finish(CLIENT_GONE, None)
        except Exception:
            log.exception("session %s: the sender failed", self._session_id)
            self.finish(SERVER_ERROR, CLOSE_INTERNAL_ERROR)

    async def _read(self) -> None:
        """One reader, so client messages are applied in the order they were sent."""
        try:
            while True:
                await self.input_room()  # the replies to what we read so far go out first
                raw = await self.receive()
                if raw is None or await self.handle(raw):
                    return
        except SlowClientError as exc:
            self._too_slow(exc)
        except SOCKET_ERRORS:
            self.finish(CLIENT_GONE, None)
        except Exception:
            log.exception("session %s: the reader failed", self._session_id)
            self.finish(SERVER_ERROR, CLOSE_INTERNAL_ERROR)

    def _too_slow(self, exc: SlowClientError) -> None:
        """The client stopped reading: closed, logged and counted once (the reader and
        the sender may both notice)."""
        if self._end.is_set():
            return
        self.finish(TOO_SLOW, CLOSE_TOO_SLOW)
        self.slow.closed(self.TRANSPORT, self._session_id, str(exc))

    @property
    def _session_id(self) -> str | None:
        return self.session.session_id if self.session is not None else None

    async def _catch_up(self, last_event_id: str | None) -> None:
        """Send what the client missed after `last_event_id` straight to the socket (the
        queue may be too small for it), then queue the live events held meanwhile. Raises
        what a send raises when the client has gone again."""
        session = self.session
        assert session is not None
        bodies = await read_log(session.event_log, session.session_id)
        if bodies is None:
            await self._send_message(self.error_message("resume_failed", self.resume_failed_text()))
            bodies = []

        def expand(event: Event) -> list[Message]:
            return [message for message, _ in self.messages(event)]

        replay = replay_messages(bodies, expand, last_event_id)
        if not replay.found:
            gap = self.error_message("resume_gap", self.resume_gap_text(last_event_id))
            await self._send_message(gap)
        for message in replay.missed:
            await self._send_message(message)
        held, self._held = self._held or (), None
        for event in held:
            self._emit(event, replayed=event.event_id in replay.logged_ids)
