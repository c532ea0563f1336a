"""OpenAI Realtime over a WebSocket (`/v1/realtime`): one connection bound to one session.

The connection is the session's output sink (a PacedSender): events go out as GA JSON,
completed by a GAExpander; assistant audio goes out as `response.output_audio.delta`
(base64 PCM16, or G.711 when the client asked for it), paced at real time with a small
lead, so "sent" is what the client has played and a barge-in truncates there.

Client messages are read by one task and applied in order by a ClientEventDispatcher; a
malformed one gets an `error` event and the connection stays open. Those errors are
throttled (`ERROR_LIMIT` a second, the rest summarised in one `errors_suppressed` error),
so a burst of bad messages neither fills the outbound queue of a client that reads (which
would close it as too slow) nor floods the session's resume log; and the reader waits
while the outbound queue is half full (`PacedSender.input_room`), so no burst of valid
messages that each get a reply can fill it either. A message over 16 MiB
closes the connection with 1009.

Close. The client's close frame with 1000 or 1001 ends the session at once (its slot,
lease and keys freed); `serve_openai_realtime` closes it.

Resume. A dropped connection (no close frame: 1005/1006 as uvicorn reports it, a network
error, a half-open socket) leaves its session alive for a grace period (30 s): the
session goes on logging events. A client that reconnects with `session_id`,
`resume_token` (from `session.created`, under `session.parley`) and `last_event_id` gets
the events it missed, then the live ones, each exactly once. Sessions live in the process
that created them: a resume must reach the same process (route by session id), and
`OpenAIConnections` is per process too. A client reconnecting while the server still
holds its old, half-open connection takes the session over; the old one is closed.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import logging
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr
from starlette.websockets import WebSocket, WebSocketDisconnect

from sessions.errors import SessionClosedError
from sessions.events import Event, OutputAudioDelta, SessionClosed, new_id
from sessions.session import Session

from ..client_events import AudioFormats
from ..dispatch import ClientEventDispatcher
from ..g711 import G711, PCMA, PCMU
from ..server_events import to_wire
from .connections import CLOSE_VERDICT_S, DEFAULT_GRACE_S, closed_cleanly
from .ga_events import AFTER_AUDIO, GAExpander
from .resume import HELD_EVENTS, read_log, replay_after
from .sender import PacedSender, SlowClientError

log = logging.getLogger("parley.realtime.websocket.openai")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
FLUSH_TIMEOUT_S = 2.0
"""How long the goodbye (session.closed and what precedes it) may take to go out."""

SOCKET_ERRORS = (WebSocketDisconnect, RuntimeError, OSError)
"""What a send or receive raises once the client is gone."""
ERROR_LIMIT = 20
"""`error` events about the client's own messages per second; the rest are summarised."""
ENDED = frozenset({"session_closed", "client_closed"})
"""Why a connection ended that ends its session too (no resume)."""


def error_message(
    code: str, message: str, error_type: str = "invalid_request_error"
) -> dict[str, Any]:
    """An `error` event of the connection's own (before a session exists, or about it)."""
    return {
        "type": "error",
        "event_id": new_id("evt"),
        "error": {"type": error_type, "code": code, "message": message, "param": None},
    }


class OpenAIRealtimeConnection(PacedSender):
    def __init__(
        self,
        websocket: WebSocket,
        *,
        formats: AudioFormats,
        beta: bool = False,
        grace_s: float = DEFAULT_GRACE_S,
    ) -> None:
        super().__init__(self._send_message, self._audio_message)
        self.websocket = websocket
        self.expander = GAExpander(beta=beta)
        self.grace_s = grace_s
        self.session: Session | None = None
        self.dispatcher: ClientEventDispatcher | None = None
        self.close_reason = ""
        self.close_code = 1000
        self._formats = formats
        self._codec = G711()
        self._end = asyncio.Event()
        self._done = asyncio.Event()
        self._held: collections.deque[Event] | None = None
        self._last_sent_id = ""
        self._audio_seq = 0
        self._audio_owner = ("", "")
        """(response_id, item_id) of the audio in the queue: the latest response's."""

    @property
    def formats(self) -> AudioFormats:
        return self.dispatcher.formats if self.dispatcher is not None else self._formats

    def bind(self, session: Session) -> None:
        self.session = session
        self.dispatcher = ClientEventDispatcher(
            session, transport="websocket", g711=self._codec, error_limit=ERROR_LIMIT
        )
        self.dispatcher.formats = self._formats

    # --- OutputSink ----------------------------------------------------------------------

    def event(self, event: Event) -> None:
        if self._held is not None:
            self._held.append(event)
        else:
            self._emit(event)

    def _emit(self, event: Event) -> None:
        if isinstance(event, OutputAudioDelta):  # the audio itself comes through audio()
            self._audio_owner = (event.response_id, event.item_id)
            return
        wire = to_wire(event, formats=self.formats)
        if wire is not None:
            for message in self.expander.expand(event, wire):
                self.post(message, after_audio=message["type"] in AFTER_AUDIO)
        if isinstance(event, SessionClosed):
            self.finish("session_closed")

    # --- the wire ------------------------------------------------------------------------

    async def _send_message(self, message: dict[str, Any]) -> None:
        await self.websocket.send_text(json.dumps(message, separators=(",", ":")))
        self._last_sent_id = message["event_id"]

    def _audio_message(self, pcm: npt.NDArray[np.int16], rate: int) -> dict[str, Any]:
        formats = self.formats
        if rate != formats.output_rate:
            pcm = soxr.resample(pcm, rate, formats.output_rate).astype(np.int16)
        if formats.output in (PCMU, PCMA):
            payload = self._codec.encode(pcm, formats.output)
        else:
            payload = pcm.astype("<i2", copy=False).tobytes()
        self._audio_seq += 1
        response_id, item_id = self._audio_owner
        return {
            "type": self.expander.name("response.output_audio.delta"),
            # Named after the event sent before it, so a resume can start right there.
            "event_id": f"{self._last_sent_id or 'evt'}~{self._audio_seq}",
            "response_id": response_id,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": base64.b64encode(payload).decode("ascii"),
        }

    # --- resume --------------------------------------------------------------------------

    def hold(self) -> None:
        """Hold live events until `catch_up()` has sent the missed ones."""
        self._held = collections.deque(maxlen=HELD_EVENTS)

    async def catch_up(self, last_event_id: str | None) -> None:
        """Send what the client missed after `last_event_id`, then the held live events."""
        assert self.session is not None
        bodies = await read_log(self.session.event_log, self.session.session_id)
        if bodies is None:
            self.post(error_message("resume_failed", "the missed events could not be read"))
            bodies = []
        replay = replay_after(bodies, self.expander, self.formats, last_event_id)
        if not replay.found:
            self.post(
                error_message(
                    "resume_gap",
                    f"event {last_event_id} is no longer in the session's log; "
                    "every event still logged follows (drop those you have by event_id)",
                )
            )
        for message in replay.missed:
            self.post(message, after_audio=message["type"] in AFTER_AUDIO)
        held, self._held = self._held or (), None
        for event in held:
            if event.event_id not in replay.logged_ids:
                self._emit(event)

    # --- the connection's life -----------------------------------------------------------

    def finish(self, reason: str, code: int = 1000) -> None:
        """End the connection (not necessarily the session); the first reason wins."""
        if not self._end.is_set():
            self.close_reason, self.close_code = reason, code
            self._end.set()

    async def take_over(self) -> None:
        """Another connection resumes this session: close this one (detaching the
        session), and return once that is done."""
        self.finish("taken_over")
        await self._done.wait()

    async def serve(self) -> None:
        """Run until the client leaves or the session ends, then tear down in order."""
        assert self.session is not None
        name = self.session.session_id
        sender = asyncio.create_task(self._run_sender(), name=f"{name}:ws-out")
        reader = asyncio.create_task(self._read(), name=f"{name}:ws-in")
        try:
            await self._end.wait()
        finally:
            reader.cancel()
            await asyncio.wait({reader})
            if self.close_reason == "session_closed" and not sender.done():
                try:  # the goodbye goes out before the close
                    async with asyncio.timeout(FLUSH_TIMEOUT_S):
                        await self.flushed()
                except TimeoutError:
                    pass
            sender.cancel()
            await asyncio.wait({sender})
            self.close()
            if self.dispatcher is not None:
                self.dispatcher.close()
            await self._close_socket()
            await self._leave_session()
            self._done.set()

    async def _leave_session(self) -> None:
        session = self.session
        if session is None or self.close_reason in ENDED:
            return  # ended already, or the owner ends it (client_closed)
        # Taken over too: the answer in progress writes to this (closed) sink, so it is
        # stopped here, and the new connection attaches to a quiet session.
        try:
            await session.detach(self.grace_s)
            log.info(
                "session %s: connection lost (%s); resumable for %g s",
                session.session_id,
                self.close_reason,
                self.grace_s,
            )
        except SessionClosedError:
            pass

    async def _close_socket(self) -> None:
        if self.close_reason in ("client_gone", "client_closed"):
            return  # nothing to say goodbye to (and 1005/1006 are never sent)
        # A client that does not read may block the close frame too: returning from the
        # route closes the transport anyway.
        with contextlib.suppress(*SOCKET_ERRORS, TimeoutError):  # already gone
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                await self.websocket.close(self.close_code, self.close_reason[:120])

    async def _run_sender(self) -> None:
        try:
            await self.run()
        except SlowClientError as exc:
            log.warning("session %s: %s", self.session and self.session.session_id, exc)
            self.finish("client_too_slow", 1008)
        except SOCKET_ERRORS:
            # The reader may be about to see the client's close frame: its verdict wins.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_VERDICT_S):
                    await self._end.wait()
            self.finish("client_gone", 1006)

    async def _read(self) -> None:
        """One reader, so client events are applied in the order they were sent."""
        assert self.dispatcher is not None
        try:
            while True:
                await self.input_room()  # the replies to what we read so far go out first
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    code = int(message.get("code") or 1005)
                    self.finish("client_closed" if closed_cleanly(code) else "client_gone", code)
                    return
                raw: str | bytes | None = message.get("text")
                if raw is None:
                    raw = message.get("bytes")
                if raw is None:
                    continue
                if len(raw) > MAX_MESSAGE_BYTES or (
                    isinstance(raw, str) and len(raw.encode()) > MAX_MESSAGE_BYTES
                ):
                    self.finish("message_too_big", 1009)
                    return
                await self.dispatcher.handle_raw(raw)
        except SlowClientError as exc:
            log.warning("session %s: %s", self.session and self.session.session_id, exc)
            self.finish("client_too_slow", 1008)
        except SOCKET_ERRORS:
            self.finish("client_gone", 1006)
