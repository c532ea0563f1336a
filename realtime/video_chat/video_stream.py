"""vLLM-Omni's streaming video chat for Qwen3-Omni, at `/v1/video/chat/stream`.

One WebSocket, one session. The client configures it (`session.config`, first, within
10 s), streams camera frames and audio, and asks questions (`video.query`) about what it
sent; each answer streams back as text deltas and WAV audio deltas. video_messages.py has
the messages, video_input.py what the session takes of them, video_mapping.py how session
events become messages, video_wire.py how they go
out to a client written for vLLM-Omni, and connection.py the connection's lifecycle
(reader, paced sender, size limit, close, resume), shared with the OpenAI Realtime
endpoint.

By default the stream is vLLM-Omni's, message for message: its keys, its error texts, its
order (`response.text.done` before the first audio delta, no done messages for a
cancelled answer, `session.done` only after `video.done`). Parley's extras are for a
client whose `session.config` has `"parley": {"extras": true}` (or that resumes):
`session.created` with a resume token, an `event_id` on every message, `code` on errors,
`status` on the done messages, longer error texts, and resume.

As vLLM-Omni's server:

- A query cuts off the answer still running, adds its `audio_data` to the audio since the
  last query, and answers the buffered frames; with no frame yet it is an `error` "No
  frames buffered" (the audio stays for the next query). Empty text is a voice-only turn.
- The audio since the last query goes with the question whatever `use_audio_in_video`
  says (Parley's engine has no separate audio-in-video mode); less than 100 ms is dropped.
- Any client message keeps the session from its idle timeout (60 s).

Where this goes past vLLM-Omni's documented limits:

- Audio overflow: the audio since the last query is bounded (4 MiB, about 131 s); past
  that the oldest audio is dropped and the client is told (at most one warning a second,
  and the rest before the next answer), never the whole buffer.
- History: the session keeps the whole conversation, so every query's request carries
  all earlier turns, not just the last exchange.

Decisions:

- Turns are manual. A query commits the audio since the previous query as the user's
  speech, adds the question as text, and asks for an answer: one request with both.
- The frames a query answers are those of its own moment: from a second before the
  audio since the last query arrived to the query (sessions/frame_window.py), each frame
  stamped when it arrived; a client that names a `sampling_strategy` gets vLLM-Omni's
  rule, `num_frames` from the whole buffer (video_input.py).
- Until a valid `session.config` arrives, a malformed message gets an `error` and the
  client may try again; any other valid message gets an `error` and the connection
  closes (1008), as does 10 s of silence. A second `session.config` is an error: the
  settings are fixed for the connection.
- A message over 16 MiB closes the connection with 1009; every other bad message gets an
  `error` and the connection stays open. Those errors are throttled (`ERROR_LIMIT` a
  second, the rest summarised in one error), so a burst of bad messages never fills the
  outbound queue of a client that reads; nor does a burst of valid ones that each get a
  reply (`ping`): the reader waits while that queue is half full.
- A missing or wrong API key is refused before the upgrade with HTTP 401 (503 while the
  server starts), as on `/v1/realtime` (the route, web/video_ws.py).
- The client's close frame with 1000 or 1001 ends the session at once, like `video.done`
  without waiting for the answer.
- `video.done` waits for the running answer to finish (its audio played out), then
  `session.done` and close 1000. A session that ends by itself (idle for 60 s, its
  maximum lifetime) sends an `error` saying why, then closes 1000.

Resume (an extra): every server message carries an `event_id` (video_mapping.py says how
they are made). A connection that drops (no close frame: a network error, a half-open
socket; not `video.done`, a clean close or the session's own end) leaves the session alive
for a grace period (30 s, as on the OpenAI endpoint), its events logged. A client that
reconnects and sends `session.resume {session_id, resume_token, last_event_id}` first,
instead of the config, gets the messages it missed (not the audio), each exactly once and
in order, then the live ones; the connection keeps the first one's settings and the audio
since the last query. A wrong token or a session that has ended: `error`, close 1008. A
resume while the server still holds the old, half-open connection takes the session over
(the old one closes). A resume may reach any process: one that does not hold the session
takes it over from Redis (connections.py), with the settings the stream kept in the
session record; the audio sent since the last query is not carried over (the frames
are: they are in Redis). A drain or a move ends the connection with an `error`
(`server_draining` / `session_moved`) and close 1012: resume with the token. A session
without the extras ends when its connection drops.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from pydantic import ValidationError
from starlette.websockets import WebSocket

from pipeline.audio_format import INPUT_SAMPLE_RATE as SAMPLE_RATE
from sessions import (
    MIN_COMMIT_MS,
    MediaError,
    ParleyError,
    Session,
    SessionClosedError,
    SessionLimitError,
    SessionManager,
    SessionState,
)
from sessions.events import Event, SessionClosed, SessionStateChanged

from ..error_throttle import ErrorThrottle, summary_text
from ..slow_clients import DEFAULT_SLOW_CLIENTS, SlowClients
from ..transports.websocket.connection import (
    CLIENT_GONE,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    SESSION_CLOSED,
    TAKEN_OVER,
    MessageConnection,
)
from ..transports.websocket.connections import DEFAULT_GRACE_S, ConnectionRegistry, claim_session
from ..transports.websocket.sender import Message
from .audio_window import BYTES_PER_MS, AudioWindow, ms_of
from .video_input import (
    MAX_AUDIO_BYTES,
    bad_image,
    frame_image,
    pcm_audio,
    pieces,
    session_settings,
)
from .video_mapping import VideoMessages, wav_delta
from .video_messages import (
    AudioChunkMessage,
    ClientMessage,
    ErrorMessage,
    MessageError,
    PingMessage,
    Pong,
    ServerMessage,
    SessionConfigMessage,
    SessionResumeMessage,
    VideoDoneMessage,
    VideoFrameMessage,
    VideoQueryMessage,
    parse_message,
)
from .video_wire import VllmOmniWire, encode

log = logging.getLogger("parley.realtime.websocket.video")

CONFIG_TIMEOUT_S = 10.0
OVERFLOW_WARNING_INTERVAL_S = 1.0
ERROR_LIMIT = 20
"""`error` messages about the client's own messages per second; the rest are summarised."""
MIN_QUERY_AUDIO_BYTES = MIN_COMMIT_MS * BYTES_PER_MS
CLIENT_DONE = "client_done"


@dataclass
class VideoChatState:
    """What a stream's session carries from one connection to the next on a resume: the
    settings and the audio since the last query."""

    config: SessionConfigMessage = field(
        default_factory=lambda: SessionConfigMessage(type="session.config")
    )
    window: AudioWindow = field(default_factory=lambda: AudioWindow(MAX_AUDIO_BYTES))
    has_frames: bool = False
    """Whether a frame was buffered: a query needs one."""
    unreported_drop: int = 0
    """Audio dropped from the window that no warning has mentioned yet."""
    last_warning: float = -math.inf


class VideoChatStream(MessageConnection):
    """One connection: the video chat mapping on the shared connection lifecycle."""

    TRANSPORT = "video_stream"
    RESUMABLE = frozenset({CLIENT_GONE, TAKEN_OVER})
    """A drop, a take-over; every other end closes the session (a message over the size
    limit, a client closed for not reading: slow_clients.py)."""
    SAYS_WHY = False
    """vLLM-Omni's clients get a bare close code."""

    def __init__(
        self,
        websocket: WebSocket,
        manager: SessionManager,
        streams: VideoStreams,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        caller: str | None = None,
        slow: SlowClients = DEFAULT_SLOW_CLIENTS,
    ) -> None:
        """`caller`: whom its session counts against (sessions/key_limits.py)."""
        super().__init__(websocket, manager, wav_delta, grace_s=grace_s, slow=slow)
        self._streams = streams
        self._caller = caller
        self.state = VideoChatState()
        self._mapping = VideoMessages(audio_output=True)
        self._idle = asyncio.Event()
        self._idle.set()
        self._errors = ErrorThrottle(self._summarise_errors, limit=ERROR_LIMIT)
        self._wire = VllmOmniWire()
        self._resuming = False

    @property
    def extras(self) -> bool:
        """Whether the client opted in to Parley's extras (a resume is Parley's own)."""
        return self._resuming or self.state.config.extras

    @property
    def resumable(self) -> bool:
        """Only a client that has the resume token can come back."""
        return self.extras and super().resumable

    async def _send_message(self, message: Message) -> None:
        if self.extras:
            await super()._send_message(message)
            return
        for out in self._wire.shape(message):
            await self.websocket.send_text(encode(out))

    async def run_connection(self) -> None:
        """The whole connection: its configuration (or resume), then its session."""
        try:
            if await self._open():
                await self.serve(self._streams)
        finally:
            self._errors.close()
            await self.close_socket()

    async def _open(self) -> bool:
        """A session from the first message; False when there is none to serve."""
        first = await self._configure()
        if first is None:
            return False
        if isinstance(first, SessionResumeMessage):
            self._resuming = True
            return await self._resume(first)
        return await self._start(first)

    async def _start(self, config: SessionConfigMessage) -> bool:
        """A new session with `config`; False when refused."""
        self.state.config = config
        self._mapping = VideoMessages(audio_output=config.audio_output)
        try:
            self.session = await self.manager.create(
                self, session_settings(config), caller=self._caller
            )
        except ParleyError as exc:
            await self._report(str(exc), exc.code)
            limited = isinstance(exc, SessionLimitError)
            self.finish("refused", CLOSE_TRY_AGAIN if limited else CLOSE_POLICY)
            return False
        return True

    def transport_state(self) -> dict[str, Any] | None:
        if not self.extras:
            return None  # nobody can resume it
        return {"video": self.state.config.model_dump(mode="json")}

    async def _resume(self, message: SessionResumeMessage) -> bool:
        """Take over the session of a dropped connection; False when refused."""
        try:
            claimed = await claim_session(
                self.manager,
                self._streams,
                message.session_id,
                message.resume_token,
                caller=self._caller,
            )
        except SessionLimitError as exc:
            await self._report(str(exc), exc.code)
            self.finish("refused", CLOSE_TRY_AGAIN)
            return False
        session, old = claimed if claimed is not None else (None, None)
        state = old.state if old is not None else None
        if session is not None and old is None:  # taken over from another process
            state = await kept_state(session)
            if state is None:  # not a video chat stream's session
                await session.detach(self.grace_s)
        if session is None or state is None:
            await self._refuse(
                f"No resumable session {message.session_id} (it ended, or the resume token "
                "is wrong)"
            )
            return False
        self.state = state
        self._mapping = VideoMessages(audio_output=self.state.config.audio_output)
        try:
            self.resume_into(session, message.last_event_id)
        except SessionClosedError:
            await self._refuse(f"The session {message.session_id} has just ended")
            return False
        log.info("video stream %s resumed after %s", session.session_id, message.last_event_id)
        return True

    async def _refuse(self, text: str) -> None:
        await self._report(text, "session_not_found")
        self.finish("refused", CLOSE_POLICY)

    async def _report(self, text: str, code: str, short: str = "") -> None:
        """An `error` message: queued once there is a session, else sent at once."""
        await self.say(self._error_of(text, code, short))

    def _error_of(self, text: str, code: str, short: str = "") -> Message:
        """An `error`: the full text for a client with the extras, else `short` (vLLM-Omni's
        wording), when there is one."""
        return ErrorMessage(message=text if self.extras else short or text, code=code).wire()

    def _tell(self, message: ServerMessage, *, after_audio: bool = False) -> None:
        """Queue a message of the connection's own (no session event behind it)."""
        self.post(message.wire(), after_audio=after_audio)

    # --- the message mapping -------------------------------------------------------------

    def messages(self, event: Event) -> list[tuple[Message, bool]]:
        return self._mapping.expand(event)

    def observe(self, event: Event) -> None:
        if (
            isinstance(event, SessionStateChanged)
            and event.state == SessionState.LISTENING.value
            or isinstance(event, SessionClosed)
        ):
            self._idle.set()

    def error_message(self, code: str, text: str) -> Message:
        return ErrorMessage(message=text, code=code).wire()

    def on_close(self) -> None:
        self._errors.close()

    async def _idle_after_answer(self) -> None:
        """Return once no answer is running: generated, played out, back to listening."""
        await self._idle.wait()

    # --- before the session --------------------------------------------------------------

    async def _next_text(self) -> str | None:
        """The next text message; None when the connection is to end."""
        while True:
            raw = await self.receive()
            if raw is None or isinstance(raw, str):
                return raw
            await self._report(
                "Send JSON text messages, not binary ones", "invalid_message", "Invalid JSON"
            )

    async def _configure(self) -> SessionConfigMessage | SessionResumeMessage | None:
        """Wait for the first valid message, which must be `session.config` (or
        `session.resume`)."""
        deadline = asyncio.get_running_loop().time() + CONFIG_TIMEOUT_S
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    raw = await self._next_text()
            except TimeoutError:
                await self._report(
                    f"No session.config within {CONFIG_TIMEOUT_S:g} s: it must come first",
                    "config_timeout",
                    "Timeout waiting for session.config",
                )
                self.finish("config_timeout", CLOSE_POLICY)
                return None
            if raw is None:
                return None
            try:
                message = parse_message(raw)
            except MessageError as exc:
                short = (
                    "Invalid JSON in session.config" if exc.short == "Invalid JSON" else exc.short
                )
                await self._report(str(exc), exc.code, short)
                continue
            if isinstance(message, SessionConfigMessage | SessionResumeMessage):
                return message
            await self._report(
                f"The first message must be session.config, not {message.type}",
                "config_required",
                f"Expected session.config, got: {message.type}",
            )
            self.finish("config_required", CLOSE_POLICY)
            return None

    # --- the session's life --------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> bool:
        session = self.session
        assert session is not None
        try:
            session.attach(self)  # any message keeps the session from its idle timeout
            if isinstance(raw, bytes):
                raise MessageError("Send JSON text messages, not binary ones", short="Invalid JSON")
            return await self._apply(parse_message(raw), session)
        except MessageError as exc:
            self._error(str(exc), exc.code, exc.short)
        except SessionClosedError:
            self.finish(SESSION_CLOSED)
            return True
        except ParleyError as exc:
            self._error(str(exc), exc.code)
        return False

    def _error(self, text: str, code: str, short: str = "") -> None:
        """An `error` about a client message, within the connection's error budget."""
        if self._errors.admit(code, text):
            self.post(self._error_of(text, code, short))

    def _summarise_errors(self, count: int, first: str) -> None:
        if self.session is not None and not self.closed:
            text = summary_text(count, first, self._errors.limit, self._errors.window_s)
            self._tell(ErrorMessage(message=text, code="errors_suppressed"))

    async def _apply(self, message: ClientMessage, session: Session) -> bool:
        """Apply one message; True when the client is done."""
        match message:
            case VideoFrameMessage():
                await self._frame(message.data, session)
            case AudioChunkMessage():
                await self._audio(message.data, session)
            case VideoQueryMessage():
                await self._query(message, session)
            case VideoDoneMessage():
                await self._idle_after_answer()
                self.finish(CLIENT_DONE, CLOSE_NORMAL)
                return True
            case PingMessage():
                self._tell(Pong())
            case SessionConfigMessage():
                raise MessageError(
                    "session.config: the session is configured already; its settings are "
                    "fixed for the connection",
                    "config_fixed",
                    "Unknown type: session.config",
                )
            case SessionResumeMessage():
                raise MessageError(
                    "session.resume: only as the first message of a new connection",
                    "resume_not_first",
                    "Unknown type: session.resume",
                )
        return False

    # --- media and questions -------------------------------------------------------------

    async def _frame(self, data: str, session: Session) -> None:
        image = frame_image(data)
        if image is None:
            return
        try:
            await session.add_frame(image)
        except MediaError as exc:
            raise bad_image(str(exc)) from None
        self.state.has_frames = True

    async def _audio(self, data: str, session: Session) -> None:
        frames, dropped = self.state.window.add(pcm_audio(data))
        if dropped:
            self.state.unreported_drop += dropped
            self._warn_overflow()
        for piece in pieces(frames):
            await session.append_audio(piece, SAMPLE_RATE, 1)

    def _warn_overflow(self, *, now: bool = False) -> None:
        """Say how much old audio was dropped: at most once a second, unless `now`."""
        clock = asyncio.get_running_loop().time()
        if not self.state.unreported_drop or (
            not now and clock - self.state.last_warning < OVERFLOW_WARNING_INTERVAL_S
        ):
            return
        dropped, self.state.unreported_drop = self.state.unreported_drop, 0
        self.state.last_warning = clock
        keep = self.state.window.max_bytes
        text = (
            f"Audio buffer overflow: dropped the oldest {ms_of(dropped)} ms ({dropped} bytes) "
            f"of audio; the buffer keeps the newest {ms_of(keep) / 1000:.1f} s ({keep} bytes) "
            "since the last query"
        )
        self.post(self._error_of(text, "audio_buffer_overflow", "Audio buffer overflow"))

    async def _query(self, query: VideoQueryMessage, session: Session) -> None:
        """As vLLM-Omni: cut the running answer off, take the query's audio, then answer
        the buffered frames (none: an error, and the audio waits for the next query)."""
        if session.responding:
            await session.cancel_response()  # a soft interrupt: the new question wins
        if query.audio_data:
            try:
                await self._audio(query.audio_data, session)
            except MessageError as exc:
                if self.extras:  # vLLM-Omni ignores audio it cannot decode
                    self._error(f"video.query: audio_data: {exc}", exc.code)
        if not self.state.has_frames:
            raise MessageError(
                "No frames buffered: send a video.frame before a video.query",
                "no_frames",
                "No frames buffered",
            )
        audio, dropped = self.state.window.take()
        self._warn_overflow(now=True)
        if len(audio) >= MIN_QUERY_AUDIO_BYTES:
            if dropped:  # the session also holds audio older than the window: replace it
                await session.clear_audio()
                for piece in pieces(audio):
                    await session.append_audio(piece, SAMPLE_RATE, 1)
            await session.commit_audio()
        elif audio or dropped:
            await session.clear_audio()
        if query.text.strip():
            await session.add_text(query.text)
        await session.create_response()
        self._idle.clear()  # `video.done` waits for this answer


async def kept_state(session: Session) -> VideoChatState | None:
    """A stream's state from the session record (a resume on another process): its
    settings, and whether frames are buffered; None when the record has no stream."""
    kept = session.transport.get("video")
    if not isinstance(kept, dict):
        return None
    try:
        config = SessionConfigMessage.model_validate(kept)
    except ValidationError:
        return None
    return VideoChatState(config=config, has_frames=await session.frames.count() > 0)


VideoStreams: TypeAlias = ConnectionRegistry[VideoChatStream]
"""Per process: the video stream that last served each session, for resumes."""
