"""OpenAI Realtime over a WebSocket (`/v1/realtime`): one connection bound to one session.

The connection's lifecycle (reader, paced sender, size limit, close, resume) is the
MessageConnection's (connection.py); this is OpenAI's message mapping on top. Events go out
as GA JSON, completed by a GAExpander; assistant audio goes out as
`response.output_audio.delta` (base64 PCM16, or G.711 when the client asked for it), paced
at real time with a small lead, so "sent" is what the client has played and a barge-in
truncates there.

Client messages are applied in order by a ClientEventDispatcher; a malformed one gets an
`error` event and the connection stays open. Those errors are throttled (`ERROR_LIMIT` a
second, the rest summarised in one `errors_suppressed` error), so a burst of bad messages
neither fills the outbound queue of a client that reads (which would close it as too slow)
nor floods the session's resume log. A message over 16 MiB closes the connection with 1009
(and the session waits for a resume, as after a drop). A client that stops reading is
closed with 1008 `client_too_slow` and its session ends (slow_clients.py).

Close. The client's close frame with 1000 or 1001 ends the session at once (its slot,
lease and keys freed).

Resume. A dropped connection (no close frame: 1005/1006 as uvicorn reports it, a network
error, a half-open socket) leaves its session alive for a grace period (30 s): the
session goes on logging events. A client that reconnects with `session_id`,
`resume_token` (from `session.created`, under `session.parley`) and `last_event_id` gets
the events it missed, then the live ones, each exactly once. A resume may reach any
process: one that does not hold the session takes it over from Redis (connections.py),
with the audio formats the last connection kept in the session record. A client
reconnecting while a server still holds its old, half-open connection takes the session
over; the old one is closed (1000 in the same process; an `error` `session_moved` and
1012 from another one). A drain ends the connection with an `error` `server_draining`
(type `server_error`) and 1012: reconnect with the resume token.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr
from starlette.websockets import WebSocket

from sessions import Session, SessionManager
from sessions.events import Event, OutputAudioDelta, new_id

from ..g711 import G711, PCMA, PCMU
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.websocket.connection import (
    CLIENT_GONE,
    MESSAGE_TOO_BIG,
    TAKEN_OVER,
    MessageConnection,
)
from ..transports.websocket.connections import DEFAULT_GRACE_S
from ..transports.websocket.sender import Message
from .client_events import AudioFormats
from .dispatch import ClientEventDispatcher
from .ga_events import AFTER_AUDIO, GAExpander
from .server_events import to_wire

ERROR_LIMIT = 20
"""`error` events about the client's own messages per second; the rest are summarised."""


def error_message(
    code: str, message: str, error_type: str = "invalid_request_error"
) -> dict[str, Any]:
    """An `error` event of the connection's own (before a session exists, or about it)."""
    return {
        "type": "error",
        "event_id": new_id("evt"),
        "error": {"type": error_type, "code": code, "message": message, "param": None},
    }


def ga_messages(
    event: Event, expander: GAExpander, formats: AudioFormats, *, extra_events: bool = False
) -> list[tuple[Message, bool]]:
    """OpenAI's message mapping: the GA JSON of a session event, completed by `expander`,
    each message with its `after_audio` flag. Audio deltas map to nothing: the audio itself
    comes through `audio()`, and a replay never sends stale audio. Parley's own events go
    out only with `extra_events` (the session's `parley.extra_events`)."""
    if isinstance(event, OutputAudioDelta):
        return []
    wire = to_wire(event, formats=formats, extra_events=extra_events)
    if wire is None:
        return []
    return [(m, m["type"] in AFTER_AUDIO) for m in expander.expand(event, wire)]


def output_payload(
    pcm: npt.NDArray[np.int16], rate: int, formats: AudioFormats, codec: G711
) -> bytes:
    """A piece of the session's speech (PCM16 at `rate`) in the client's output format,
    G.711-coded where it asked for that. The connection's playout has resampled it to the
    client's rate already, as one stream per response; only a piece queued before the
    client changed its output format comes at another rate, and is resampled on its own."""
    if rate != formats.output_rate:
        pcm = soxr.resample(pcm, rate, formats.output_rate).astype(np.int16)
    if formats.output in (PCMU, PCMA):
        return codec.encode(pcm, formats.output)
    return pcm.astype("<i2", copy=False).tobytes()


class OpenAIRealtimeConnection(MessageConnection):
    TRANSPORT = "openai_ws"
    RESUMABLE = frozenset({CLIENT_GONE, TAKEN_OVER, MESSAGE_TOO_BIG})
    """A drop, a take-over and a message over the size limit leave the session waiting for
    a resume. The client's clean close, the session's own end, a server error (no drop)
    and a client closed for not reading (slow_clients.py) end it."""

    def __init__(
        self,
        websocket: WebSocket,
        manager: SessionManager,
        *,
        formats: AudioFormats,
        beta: bool = False,
        grace_s: float = DEFAULT_GRACE_S,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    ) -> None:
        super().__init__(
            websocket,
            manager,
            self._audio_message,
            grace_s=grace_s,
            slow=slow,
            output_rate=formats.output_rate,
        )
        self.expander = GAExpander(beta=beta)
        self.dispatcher: ClientEventDispatcher | None = None
        self._formats = formats
        self._codec = G711()
        self._audio_owner = ("", "")
        """(response_id, item_id) of the audio in the queue: the latest response's."""

    @property
    def formats(self) -> AudioFormats:
        return self.dispatcher.formats if self.dispatcher is not None else self._formats

    def bind(self, session: Session, formats: AudioFormats | None = None) -> None:
        """Serve `session` from now on (with `formats`: a resumed session's, as the last
        connection had them)."""
        if formats is not None:
            self._formats = formats
            self.playout.set_rate(formats.output_rate)
        self.session = session
        self.dispatcher = self.new_dispatcher(session)
        self.dispatcher.formats = self._formats

    def new_dispatcher(self, session: Session) -> ClientEventDispatcher:
        """What applies this connection's client events to `session`."""
        return ClientEventDispatcher(
            session, transport="websocket", g711=self._codec, error_limit=ERROR_LIMIT
        )

    # --- the message mapping -------------------------------------------------------------

    def messages(self, event: Event) -> list[tuple[Message, bool]]:
        extra = self.session is not None and self.session.config.extra_events
        return ga_messages(event, self.expander, self.formats, extra_events=extra)

    def observe(self, event: Event) -> None:
        if isinstance(event, OutputAudioDelta):
            self._audio_owner = (event.response_id, event.item_id)

    async def handle(self, raw: str | bytes) -> bool:
        assert self.dispatcher is not None
        await self.dispatcher.handle_raw(raw)
        formats = self.dispatcher.formats
        if formats is not self._formats:  # a session.update (identity first: 50 appends a second)
            changed, self._formats = formats != self._formats, formats
            if changed:
                self.playout.set_rate(formats.output_rate)
                await self.remember_transport()
        return False

    def error_message(self, code: str, text: str) -> Message:
        return error_message(code, text)

    def reconnect_message(self, code: str, text: str) -> Message:
        return error_message(code, text, "server_error")

    def transport_state(self) -> dict[str, Any]:
        return {"formats": dataclasses.asdict(self.formats)}

    async def refuse(
        self, code: str, text: str, close_code: int, error_type: str = "invalid_request_error"
    ) -> None:
        """No session for this connection: an `error` event, then a close saying `code`."""
        await self.say(error_message(code, text, error_type))
        self.finish(code, close_code)

    def on_close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.close()

    def resume_failed_text(self) -> str:
        return "the missed events could not be read"

    def resume_gap_text(self, last_event_id: str | None) -> str:
        return (
            f"event {last_event_id} is no longer in the session's log; "
            "every event still logged follows (drop those you have by event_id)"
        )

    def _audio_message(self, pcm: npt.NDArray[np.int16], rate: int) -> Message:
        """One piece of speech as a `response.output_audio.delta` (its `event_id` is
        given at send time, after the event sent before it)."""
        payload = output_payload(pcm, rate, self.formats, self._codec)
        response_id, item_id = self._audio_owner
        return {
            "type": self.expander.name("response.output_audio.delta"),
            "response_id": response_id,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": base64.b64encode(payload).decode("ascii"),
        }
