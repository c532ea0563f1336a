"""vLLM-Omni's streaming video chat for Qwen3-Omni, at `/v1/video/chat/stream`.

One WebSocket, one session. The client configures it (`session.config`, first, within
10 s), streams camera frames and audio, and asks questions (`video.query`) about what it
sent; each answer streams back as text deltas and WAV audio deltas. video_messages.py has
the messages, video_sink.py how session events become them.

Where this goes past vLLM-Omni's documented limits:

- Audio overflow: the audio since the last query is bounded (4 MiB, about 131 s); past
  that the oldest audio is dropped and the client is told how much (at most one warning a
  second, and the rest before the next answer), never the whole buffer.
- Back-to-back queries: a query while an answer runs cuts that answer off (its
  `response.text.done` and `response.audio.done` say `"status": "cancelled"`, the text is
  what was sent so far) and starts the new one at once; no idle gap is needed.
- History: the session keeps the whole conversation, so every query's request carries
  all earlier turns, not just the last exchange.

Decisions:

- Turns are manual. A query commits the audio since the previous query as the user's
  speech (with `use_audio_in_video`, and at least 100 ms of it), adds the question as
  text, and asks for an answer: one request with both. Without `use_audio_in_video` the
  audio is dropped at each query.
- Until a valid `session.config` arrives, a malformed message gets an `error` and the
  client may try again; any other valid message gets an `error` and the connection
  closes (1008), as does 10 s of silence. A second `session.config` is an error: the
  settings are fixed for the connection.
- A message over 16 MiB closes the connection with 1009; every other bad message gets an
  `error` and the connection stays open. Those errors are throttled (`ERROR_LIMIT` a
  second, the rest summarised in one `errors_suppressed` error), so a burst of bad
  messages never fills the outbound queue of a client that reads; nor does a burst of
  valid ones that each get a reply (`ping`): the reader waits while that queue is half
  full.
- A missing or wrong API key is refused before the upgrade with HTTP 401 (503 while the
  server starts), as on `/v1/realtime` (the route, web/video_ws.py).
- The client's close frame with 1000 or 1001 ends the session at once, like `video.done`
  without waiting for the answer.
- `video.done` waits for the running answer to finish (its audio played out), then
  `session.done` and close 1000. A session that ends by itself (idle for 60 s, its
  maximum lifetime) sends an `error` saying why, then `session.done`, then closes 1000.

Resume (Parley's own; a vLLM-Omni client may ignore it): after `session.config` the server
sends `session.created {session_id, resume_token}`, and every server message carries an
`event_id` (video_sink.py says how they are made). A connection that drops (no close
frame: a network error, a half-open socket; not `video.done`, a clean close or the
session's own end) leaves the session alive for a grace period (30 s, as on the OpenAI
endpoint), its events logged. A client that reconnects and sends
`session.resume {session_id, resume_token, last_event_id}` first, instead of the config,
gets the messages it missed (not the audio), each exactly once and in order, then the live
ones; the connection keeps the first one's settings and the audio since the last query. A
wrong token or a session that has ended: `error`, close 1008. A resume while the server
still holds the old, half-open connection takes the session over (the old one closes).
Sessions live in the process that created them: route resumes to it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import math
import re
from typing import Any, TypeAlias

from starlette.websockets import WebSocket, WebSocketDisconnect

from sessions.errors import MediaError, ParleyError, SessionClosedError, SessionLimitError
from sessions.manager import SessionManager
from sessions.resample import MAX_APPEND_BYTES, SAMPLE_RATE
from sessions.session import MIN_COMMIT_MS, Session

from ..error_throttle import ErrorThrottle, summary_text
from .audio_window import BYTES_PER_MS, AudioWindow, ms_of
from .connections import (
    CLOSE_VERDICT_S,
    DEFAULT_GRACE_S,
    ConnectionRegistry,
    closed_cleanly,
    resumable_session,
)
from .sender import Message, SlowClientError
from .video_messages import (
    AudioChunkMessage,
    ClientMessage,
    ErrorMessage,
    MessageError,
    PingMessage,
    Pong,
    SessionConfigMessage,
    SessionResumeMessage,
    VideoDoneMessage,
    VideoFrameMessage,
    VideoQueryMessage,
    parse_message,
)
from .video_sink import VideoStreamSink, with_id

log = logging.getLogger("parley.realtime.websocket.video")

CONFIG_TIMEOUT_S = 10.0
FLUSH_TIMEOUT_S = 2.0
"""How long the goodbye (`session.done`) may take to go out before the socket closes."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_FRAME_BYTES = 10 * 1024 * 1024
MAX_AUDIO_BYTES = 4 * 1024 * 1024
OUTPUT_SAMPLE_RATE = 24_000
OVERFLOW_WARNING_INTERVAL_S = 1.0
ERROR_LIMIT = 20
"""`error` messages about the client's own messages per second; the rest are summarised."""
MIN_QUERY_AUDIO_BYTES = MIN_COMMIT_MS * BYTES_PER_MS
SESSION_AUDIO_SECONDS = math.ceil(MAX_AUDIO_BYTES / (BYTES_PER_MS * 1000)) + 1
"""The session's audio buffer holds a little more than the window, so nothing in the
window is ever trimmed from it."""

CLOSE_NORMAL = 1000
CLOSE_INTERNAL_ERROR = 1011
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN = 1013

RESUMABLE = frozenset({"client_gone", "slow_client", "taken_over"})
"""Why a connection ended that leaves its session waiting for a resume."""

_DATA_URL = re.compile(r"data:[\w/+.-]*;base64,")


def session_settings(config: SessionConfigMessage) -> dict[str, Any]:
    """The session's settings for a video chat: manual turns and the client's knobs."""
    settings: dict[str, Any] = {
        "output_modalities": list(config.modalities),
        "turn_detection": None,
        "video": {
            "num_frames": config.num_frames,
            "max_frames": config.max_frames,
            "sampling_strategy": config.sampling_strategy,
            "frame_filter": config.enable_frame_filter,
            "frame_filter_threshold": config.frame_filter_threshold,
        },
        "output_sample_rate": OUTPUT_SAMPLE_RATE,
        "max_audio_seconds": SESSION_AUDIO_SECONDS,
    }
    if config.system_prompt:
        settings["instructions"] = config.system_prompt
    if config.speaker:
        settings["voice"] = config.speaker
    return settings


def _decoded_size(data: str) -> int:
    """An upper bound of what base64 `data` decodes to, without decoding it."""
    return len(data) * 3 // 4


def _pieces(pcm: bytes) -> list[bytes]:
    """`pcm` in pieces the session takes in one append."""
    return [pcm[i : i + MAX_APPEND_BYTES] for i in range(0, len(pcm), MAX_APPEND_BYTES)]


class VideoChatStream:
    """One connection: its settings, its audio window, its session and sink."""

    def __init__(
        self,
        websocket: WebSocket,
        manager: SessionManager,
        streams: VideoStreams,
        *,
        grace_s: float = DEFAULT_GRACE_S,
    ) -> None:
        self._ws = websocket
        self._manager = manager
        self._streams = streams
        self.grace_s = grace_s
        """How long the session outlives a dropped connection, for a resume."""
        self.session: Session | None = None
        self._window = AudioWindow(MAX_AUDIO_BYTES)
        self._config = SessionConfigMessage(type="session.config")
        self._sink: VideoStreamSink | None = None
        self._close_code: int | None = CLOSE_NORMAL
        """How the socket closes at the end; None when the client has gone already."""
        self._close_reason = "client_done"
        """Why the session closes, as the session records it."""
        self._unreported_drop = 0
        self._last_warning = -math.inf
        self._closed = False
        self._last_id = "evt"
        """The last id sent that a session event gave (`evt` until there is one)."""
        self._seq = 0
        self._taken_over = asyncio.Event()
        self._done = asyncio.Event()
        self._errors = ErrorThrottle(self._summarise_errors, limit=ERROR_LIMIT)

    async def run(self) -> None:
        try:
            first = await self._configure()
            if first is None:
                return
            resume: SessionResumeMessage | None = None
            if isinstance(first, SessionResumeMessage):
                resume, started = first, await self._resume(first)
            else:
                started = await self._start(first)
            if not started:
                return
            assert self.session is not None and self._sink is not None
            self._streams.register(self)
            try:
                await self._live(self.session, self._sink, resume)
            finally:
                if self._close_reason not in RESUMABLE:
                    self._streams.discard(self)
        finally:
            self._errors.close()
            await self._close()
            self._done.set()

    async def _start(self, config: SessionConfigMessage) -> bool:
        """A new session with `config`; False when refused."""
        self._config = config
        sink = VideoStreamSink(self._send, audio_output=config.audio_output)
        try:
            session = await self._manager.create(sink, session_settings(config))
        except ParleyError as exc:
            await self._report(str(exc), exc.code)
            limited = isinstance(exc, SessionLimitError)
            self._close_code = CLOSE_TRY_AGAIN if limited else CLOSE_POLICY
            return False
        self.session, self._sink = session, sink
        return True

    async def _resume(self, message: SessionResumeMessage) -> bool:
        """Take over the session of a dropped connection; False when refused."""
        session = resumable_session(self._manager, message.session_id, message.resume_token)
        old = self._streams.get(message.session_id) if session is not None else None
        if session is None or old is None:
            await self._refuse(
                f"No resumable session {message.session_id} (it ended, or the resume token "
                "is wrong)"
            )
            return False
        await old.take_over()  # its teardown (the detach) ends before we attach
        self._config, self._window = old._config, old._window
        self._unreported_drop, self._last_warning = old._unreported_drop, old._last_warning
        sink = VideoStreamSink(self._send, audio_output=self._config.audio_output)
        sink.hold()
        try:
            session.attach(sink)
        except SessionClosedError:
            await self._refuse(f"The session {message.session_id} has just ended")
            return False
        self.session, self._sink = session, sink
        # Messages of our own before the first replayed one are named after what the
        # client saw last, so resuming from one of them again starts at the same place.
        anchor, _, seq = (message.last_event_id or "evt").partition("~")
        self._last_id, self._seq = anchor, int(seq) if seq.isdigit() else 0
        log.info("video stream %s resumed after %s", session.session_id, message.last_event_id)
        return True

    async def _refuse(self, text: str) -> None:
        await self._report(text, "session_not_found")
        if self._close_code is not None:
            self._close_code = CLOSE_POLICY

    async def take_over(self) -> None:
        """Another connection resumes this one's session: close this one (detaching the
        session), and return once that is done."""
        self._taken_over.set()
        await self._done.wait()

    # --- the socket ----------------------------------------------------------------------

    async def _send(self, message: Message) -> None:
        event_id = message.get("event_id")
        if event_id is None:  # no session event behind it: named after the last one sent
            self._seq += 1
            message = with_id(message, f"{self._last_id}~{self._seq}")
        elif "~" not in event_id:
            self._last_id = event_id
        await self._ws.send_text(json.dumps(message, separators=(",", ":")))

    async def _report(self, text: str, code: str) -> None:
        """An `error` message: through the sink's queue once it exists, else directly."""
        error = ErrorMessage(message=text, code=code)
        if self._sink is not None:
            self._sink.send_message(error)
            return
        try:
            await self._send(error.wire())
        except (WebSocketDisconnect, RuntimeError, OSError):
            self._close_code = None  # the client has gone

    async def _receive(self) -> str | None:
        """The next text message; None when the connection is to end (the client left,
        or sent too much at once)."""
        while True:
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                clean = closed_cleanly(message.get("code"))
                self._close_code = None
                self._close_reason = "client_closed" if clean else "client_gone"
                return None
            text: str | None = message.get("text")
            size = len(text) if text is not None else len(message.get("bytes") or b"")
            if text is not None and size > MAX_MESSAGE_BYTES // 4:
                size = len(text.encode())  # only a long text can be too long in bytes
            if size > MAX_MESSAGE_BYTES:
                self._close_code, self._close_reason = CLOSE_TOO_BIG, "message_too_big"
                return None
            if text is None:
                await self._report("Send JSON text messages, not binary ones", "invalid_message")
                continue
            return text

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._close_code is not None:
            # A client that does not read may block the close frame too: returning from
            # the route closes the transport anyway.
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError, TimeoutError):
                async with asyncio.timeout(FLUSH_TIMEOUT_S):
                    await self._ws.close(self._close_code)

    # --- before the session --------------------------------------------------------------

    async def _configure(self) -> SessionConfigMessage | SessionResumeMessage | None:
        """Wait for the first valid message, which must be `session.config` (or
        `session.resume`)."""
        deadline = asyncio.get_running_loop().time() + CONFIG_TIMEOUT_S
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    raw = await self._receive()
            except TimeoutError:
                await self._report(
                    f"No session.config within {CONFIG_TIMEOUT_S:g} s: it must come first",
                    "config_timeout",
                )
                self._close_code = CLOSE_POLICY
                return None
            if raw is None:
                return None
            try:
                message = parse_message(raw)
            except MessageError as exc:
                await self._report(str(exc), exc.code)
                continue
            if isinstance(message, SessionConfigMessage | SessionResumeMessage):
                return message
            await self._report(
                f"The first message must be session.config, not {message.type}",
                "config_required",
            )
            self._close_code = CLOSE_POLICY
            return None

    # --- the session's life --------------------------------------------------------------

    async def _live(
        self,
        session: Session,
        sink: VideoStreamSink,
        resume: SessionResumeMessage | None = None,
    ) -> None:
        """Read the client's messages until it is done, it goes, or the session ends (or
        another connection takes it over). A resumed connection first sends what the
        client missed."""
        sid = session.session_id
        output = self._output(session, sink, resume)
        sender = asyncio.create_task(output, name=f"{sid}:video-send")
        reader = asyncio.create_task(self._serve(session, sink), name=f"{sid}:video-read")
        ended = asyncio.create_task(sink.session_closed.wait(), name=f"{sid}:video-ended")
        taken = asyncio.create_task(self._taken_over.wait(), name=f"{sid}:video-taken")
        tasks = (sender, reader, ended, taken)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if sender.done() and not reader.done() and not self._too_slow(sender):
                # A send failed: the reader may be about to see the client's close frame.
                await asyncio.wait({reader}, timeout=CLOSE_VERDICT_S)
            for task in (reader, ended, taken):
                task.cancel()
            await asyncio.wait({reader, ended, taken})
            if sender.done() and self._close_reason != "client_closed":
                self._sender_ended(sender)
            elif taken.done() and not taken.cancelled():
                self._close_code, self._close_reason = CLOSE_NORMAL, "taken_over"
            elif not reader.cancelled() and reader.exception() is not None:
                log.error("video stream %s failed", sid, exc_info=reader.exception())
                self._close_code, self._close_reason = CLOSE_INTERNAL_ERROR, "server_error"
            if self._close_reason not in RESUMABLE:
                await self._manager.close_session(sid, self._close_reason)
                if self._close_code == CLOSE_NORMAL and not sender.done():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(FLUSH_TIMEOUT_S):
                            await sink.flushed()  # session.done is the last message queued
        finally:
            sink.close()
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            for task in tasks:  # retrieved, so none is reported as never retrieved
                if not task.cancelled() and task.exception() is not None:
                    log.debug(
                        "video stream %s: %s ended: %r", sid, task.get_name(), task.exception()
                    )
            await self._leave(session)

    async def _output(
        self, session: Session, sink: VideoStreamSink, resume: SessionResumeMessage | None
    ) -> None:
        """The sender: on a resume, what the client missed first; then the live output.
        Meanwhile the reader may already apply new messages: their output waits."""
        if resume is not None:
            await sink.catch_up(session.event_log, session.session_id, resume.last_event_id)
        await sink.run()

    @staticmethod
    def _too_slow(sender: asyncio.Task[None]) -> bool:
        return not sender.cancelled() and isinstance(sender.exception(), SlowClientError)

    def _sender_ended(self, sender: asyncio.Task[None]) -> None:
        if self._too_slow(sender):
            log.warning("video stream: %s", sender.exception())
            self._close_code, self._close_reason = CLOSE_POLICY, "slow_client"
        else:  # the socket is gone: nothing more can be sent
            self._close_code, self._close_reason = None, "client_gone"

    async def _leave(self, session: Session) -> None:
        """Close the session, or leave it to wait for a resume when the client may come
        back (it dropped, or a resume took over)."""
        if self._close_reason not in RESUMABLE:
            await self._manager.close_session(session.session_id, self._close_reason)
            return
        try:
            await session.detach(self.grace_s)
        except SessionClosedError:
            return
        log.info(
            "video stream %s: connection ended (%s); resumable for %g s",
            session.session_id,
            self._close_reason,
            self.grace_s,
        )

    async def _serve(self, session: Session, sink: VideoStreamSink) -> None:
        while True:
            try:
                await sink.input_room()  # the replies to what we read so far go out first
            except SlowClientError as exc:
                log.warning("video stream %s: %s", session.session_id, exc)
                self._close_code, self._close_reason = CLOSE_POLICY, "slow_client"
                return
            raw = await self._receive()
            if raw is None:
                return
            try:
                if await self._handle(parse_message(raw), session, sink):
                    return
            except MessageError as exc:
                self._error(sink, str(exc), exc.code)
            except SessionClosedError:
                return
            except ParleyError as exc:
                self._error(sink, str(exc), exc.code)

    def _error(self, sink: VideoStreamSink, text: str, code: str) -> None:
        """An `error` about a client message, within the connection's error budget."""
        if self._errors.admit(code, text):
            sink.send_message(ErrorMessage(message=text, code=code))

    def _summarise_errors(self, count: int, first: str) -> None:
        if self._sink is not None and not self._sink.closed:
            text = summary_text(count, first, self._errors.limit, self._errors.window_s)
            self._sink.send_message(ErrorMessage(message=text, code="errors_suppressed"))

    async def _handle(
        self, message: ClientMessage, session: Session, sink: VideoStreamSink
    ) -> bool:
        """Apply one message; True when the client is done."""
        match message:
            case VideoFrameMessage():
                await self._frame(message.data, session)
            case AudioChunkMessage():
                await self._audio(message.data, session, sink)
            case VideoQueryMessage():
                await self._query(message.text, session, sink)
            case VideoDoneMessage():
                await sink.idle()
                self._close_code, self._close_reason = CLOSE_NORMAL, "client_done"
                return True
            case PingMessage():
                sink.send_message(Pong())
            case SessionConfigMessage():
                raise MessageError(
                    "session.config: the session is configured already; its settings are "
                    "fixed for the connection",
                    "config_fixed",
                )
            case SessionResumeMessage():
                raise MessageError(
                    "session.resume: only as the first message of a new connection",
                    "resume_not_first",
                )
        return False

    # --- media and questions -------------------------------------------------------------

    async def _frame(self, data: str, session: Session) -> None:
        prefix = _DATA_URL.match(data)
        if prefix is not None:  # a data URL: the base64 after its header
            data = data[prefix.end() :]
        if _decoded_size(data) - 2 > MAX_FRAME_BYTES:
            raise MessageError(self._too_large(_decoded_size(data)), "frame_too_large")
        try:
            image = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise MessageError("Invalid image data: not valid base64", "invalid_image") from None
        if len(image) > MAX_FRAME_BYTES:
            raise MessageError(self._too_large(len(image)), "frame_too_large")
        try:
            await session.add_frame(image)
        except MediaError as exc:
            detail = str(exc)
            if detail.startswith("invalid image data"):
                detail = "send a base64-encoded JPEG or PNG image"
            raise MessageError(f"Invalid image data: {detail}", "invalid_image") from None

    @staticmethod
    def _too_large(size: int) -> str:
        return f"Frame too large: {size} bytes; the limit is {MAX_FRAME_BYTES} bytes (10 MiB)"

    async def _audio(self, data: str, session: Session, sink: VideoStreamSink) -> None:
        try:
            pcm = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise MessageError("Invalid audio data: not valid base64", "invalid_audio") from None
        if len(pcm) % 2:
            raise MessageError(
                "Invalid audio data: PCM16 audio has an even number of bytes", "invalid_audio"
            )
        frames, dropped = self._window.add(pcm)
        if dropped:
            self._unreported_drop += dropped
            self._warn_overflow(sink)
        for piece in _pieces(frames):
            await session.append_audio(piece, SAMPLE_RATE, 1)

    def _warn_overflow(self, sink: VideoStreamSink, *, now: bool = False) -> None:
        """Say how much old audio was dropped: at most once a second, unless `now`."""
        clock = asyncio.get_running_loop().time()
        if not self._unreported_drop or (
            not now and clock - self._last_warning < OVERFLOW_WARNING_INTERVAL_S
        ):
            return
        dropped, self._unreported_drop = self._unreported_drop, 0
        self._last_warning = clock
        keep = self._window.max_bytes
        sink.send_message(
            ErrorMessage(
                message=f"Audio buffer overflow: dropped the oldest {ms_of(dropped)} ms "
                f"({dropped} bytes) of audio; the buffer keeps the newest "
                f"{ms_of(keep) / 1000:.1f} s ({keep} bytes) since the last query",
                code="audio_buffer_overflow",
            )
        )

    async def _query(self, text: str, session: Session, sink: VideoStreamSink) -> None:
        if session.responding:
            await session.cancel_response()  # a soft interrupt: the new question wins
        audio, dropped = self._window.take()
        self._warn_overflow(sink, now=True)
        if self._config.use_audio_in_video and len(audio) >= MIN_QUERY_AUDIO_BYTES:
            if dropped:  # the session also holds audio older than the window: replace it
                await session.clear_audio()
                for piece in _pieces(audio):
                    await session.append_audio(piece, SAMPLE_RATE, 1)
            await session.commit_audio()
        elif audio or dropped:
            await session.clear_audio()
        await session.add_text(text)
        await session.create_response()
        sink.expect_response()


VideoStreams: TypeAlias = ConnectionRegistry[VideoChatStream]
"""Per process: the video stream that last served each session, for resumes."""
