"""One Twilio Media Stream (`/v1/twilio/media`) bound to one session.

The stream is the session's output sink: the answer goes out as `media` and `mark`
messages and is cleared with `clear` (twilio_playout.py: pacing, marks, barge-in); this
is the rest. The caller's `media` (mu-law, 8 kHz, the inbound track) goes to
`session.append_audio`, its echoed `mark`s to the played position, `dtmf` to the
session's DTMF event, and `stop` ends the stream. The session is made at `start`, once
its settings (and the caller's token) are known.

The stream owns its session and its two tasks (the reader and the sender): `stop`, the
caller's close, or the session's own end ends all three, once (`close()`). Bad JSON, a
message that is not Twilio's and unknown events are logged and counted, never fatal.

What goes out is bounded by the playout (2 s of audio; the session waits past that) and
one message in flight. A peer that stops reading blocks that message: after
`SlowClients.stall_s` the stream ends with 1008 `client_too_slow` and so does its session
(slow_clients.py); the close frame cannot hold up the teardown either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket

from pipeline.tasks import TaskSet, cancel_and_wait
from sessions import Session, SessionClosedError, SessionConfig, SessionLimitError, SessionManager
from sessions.errors import InvalidRequestError
from sessions.events import Event, SessionClosed

from ..g711 import ulaw_decode
from ..slow_clients import CLOSE_TOO_SLOW, DEFAULT_SLOW_CLIENTS, TOO_SLOW, SlowClients
from ..transports.websocket.connection import (
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    FLUSH_TIMEOUT_S,
    SOCKET_ERRORS,
)
from .twilio_messages import (
    SAMPLE_RATE,
    BadMessage,
    Connected,
    Dtmf,
    Mark,
    Media,
    Start,
    Stop,
    UnknownEvent,
    parse,
)
from .twilio_playout import TwilioPlayout

log = logging.getLogger("parley.realtime.twilio")

START_TIMEOUT_S = 10.0
"""How long a socket may stay open without a `start` (Twilio sends it at once)."""
SESSION_CLOSE_TIMEOUT_S = 10.0
LOGGED_BAD_MESSAGES = 10
"""Bad messages logged as warnings per stream; the rest are only counted."""

ConfigFor = Callable[[Start], tuple[SessionConfig, str | None] | None]
"""The session settings for a stream's `start` (auth included) and whom the session counts
against (sessions/key_limits.py); None refuses it."""


class TwilioStream(TwilioPlayout):
    TRANSPORT = "twilio"

    def __init__(
        self,
        websocket: WebSocket,
        manager: SessionManager,
        config_for: ConfigFor,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    ):
        super().__init__()
        self.slow = slow
        self.websocket = websocket
        self.manager = manager
        self._config_for = config_for
        self.session: Session | None = None
        self.call_sid = ""
        self.bad_messages = 0
        """Messages that were not JSON, not Twilio's, or unknown events."""
        self.close_reason = ""
        self.close_code: int | None = CLOSE_NORMAL
        self._reader: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._tasks = TaskSet("twilio")
        """Owns the reader and the sender; `close()` stops each at its step, then closes it."""
        self._closed = False

    # --- the stream's life ---------------------------------------------------------------

    async def serve(self) -> None:
        """Read the caller's messages until the stream ends, then close it."""
        self._reader = self._tasks.create_task(self._read(), name="twilio:read")
        try:
            try:
                await asyncio.wait_for(self.stopped.wait(), START_TIMEOUT_S)
            except TimeoutError:
                if self.session is None:
                    self.finish("no_start", CLOSE_POLICY)
                await self.stopped.wait()
        finally:
            await self.close()

    def finish(self, reason: str, code: int | None = CLOSE_NORMAL) -> None:
        """End the stream; the first reason wins. `code`: the close frame (None: gone)."""
        if not self.stopped.is_set():
            self.close_reason, self.close_code = reason, code
            self.stopped.set()

    async def close(self) -> None:
        """End the reader, the session, the sender and the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.finish("closed")
        await cancel_and_wait(self._reader)
        if self.session is not None and not self.session.closed:
            try:
                async with asyncio.timeout(SESSION_CLOSE_TIMEOUT_S):
                    await self.session.close(self.close_reason)
            except TimeoutError:
                log.warning("stream %s: the session did not close in time", self.stream_sid)
        self.playout.close()
        await cancel_and_wait(self._sender)
        await self._tasks.close()
        if self.close_code is not None:
            with contextlib.suppress(*SOCKET_ERRORS, TimeoutError):
                async with asyncio.timeout(FLUSH_TIMEOUT_S):  # a peer that does not read
                    await self.websocket.close(self.close_code, self.close_reason[:120])
        log.info(
            "stream %s (call %s) ended: %s; %d ms played, %d clears, %d bad messages",
            self.stream_sid,
            self.call_sid,
            self.close_reason,
            self.marks.played_ms,
            self.clears_sent,
            self.bad_messages,
        )

    # --- the caller's messages -----------------------------------------------------------

    async def _read(self) -> None:
        while True:
            try:
                message = await self.websocket.receive()
            except SOCKET_ERRORS:
                self.finish("caller_gone", None)
                return
            if message["type"] == "websocket.disconnect":
                self.finish("caller_gone", None)
                return
            raw = message.get("text") or message.get("bytes") or b""
            try:
                await self._handle(parse(raw))
            except UnknownEvent as exc:
                self._bad(str(exc))
            except BadMessage as exc:
                self._bad(f"bad message: {exc}")

    def _bad(self, why: str) -> None:
        self.bad_messages += 1
        if self.bad_messages <= LOGGED_BAD_MESSAGES:
            log.warning("stream %s: %s (ignored)", self.stream_sid or "-", why)

    async def _handle(self, message: Connected | Start | Media | Mark | Dtmf | Stop) -> None:
        match message:
            case Media():
                await self._media(message)
            case Mark(name=name):
                self.echoed(name)
            case Start():
                await self._start(message)
            case Dtmf(digit=digit):
                self._dtmf(digit)
            case Stop():
                self.finish("stop")
            case Connected():
                pass

    async def _start(self, start: Start) -> None:
        if self.session is not None:
            self._bad("a second start")
            return
        if not start.format_supported:
            log.warning("stream %s: unsupported media format %s", start.stream_sid, start)
            self.finish("unsupported_media_format", CLOSE_POLICY)
            return
        admitted = self._config_for(start)
        if admitted is None:
            self.finish("unauthorized", CLOSE_POLICY)
            return
        config, caller = admitted
        try:
            session = await self.manager.create(self, config, caller=caller)
        except SessionLimitError as exc:  # or KeyLimitError: `rate_limit_exceeded`
            log.warning("stream %s refused: %s", start.stream_sid, exc)
            self.finish(exc.code, CLOSE_TRY_AGAIN)
            return
        self.session, self.stream_sid, self.call_sid = session, start.stream_sid, start.call_sid
        self._sender = self._tasks.create_task(self.send_answer(), name="twilio:send")
        log.info("stream %s (call %s): %s", start.stream_sid, start.call_sid, session.session_id)

    async def _media(self, media: Media) -> None:
        if self.session is None:
            self._bad("media before start")
            return
        if media.track not in ("inbound", "inbound_track") or not media.payload:
            return  # Parley hears the caller only
        try:
            await self.session.append_audio(ulaw_decode(media.payload).tobytes(), SAMPLE_RATE, 1)
        except SessionClosedError:
            self.finish("session_closed")
        except InvalidRequestError as exc:
            self._bad(f"media refused: {exc}")

    def _dtmf(self, digit: str) -> None:
        """A keypad digit: the session's `input_audio_buffer.dtmf_event_received`."""
        if self.session is None:
            self._bad("dtmf before start")
            return
        try:
            self.session.dtmf(digit)
        except InvalidRequestError as exc:  # a closed session
            self._bad(f"dtmf refused: {exc}")

    # --- the answer's way out ------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> bool:
        """Send one message; False once the caller has gone or has not read for
        `stall_s` (the stream then ends)."""
        try:
            async with asyncio.timeout(self.slow.stall_s) as deadline:
                await self.websocket.send_text(json.dumps(message))
        except SOCKET_ERRORS:  # (TimeoutError is an OSError)
            if not deadline.expired():
                self.finish("caller_gone", None)
            elif not self.stopped.is_set():
                self.finish(TOO_SLOW, CLOSE_TOO_SLOW)
                why = f"one message could not be written for {self.slow.stall_s:g} s"
                session_id = self.session.session_id if self.session is not None else None
                self.slow.closed(self.TRANSPORT, session_id, why)
            return False
        return True

    # --- OutputSink ----------------------------------------------------------------------

    def event(self, event: Event) -> None:
        if isinstance(event, SessionClosed):
            self.finish(event.reason)
