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
  `error` and the connection stays open.
- `video.done` waits for the running answer to finish (its audio played out), then
  `session.done` and close 1000. A session that ends by itself (idle for 60 s, its
  maximum lifetime) sends an `error` saying why, then `session.done`, then closes 1000.
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
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from sessions.errors import MediaError, ParleyError, SessionClosedError, SessionLimitError
from sessions.manager import SessionManager
from sessions.resample import MAX_APPEND_BYTES, SAMPLE_RATE
from sessions.session import MIN_COMMIT_MS, Session

from ..auth import AuthError
from .audio_window import BYTES_PER_MS, AudioWindow, ms_of
from .sender import Message, SlowClientError
from .video_messages import (
    AudioChunkMessage,
    ClientMessage,
    ErrorMessage,
    MessageError,
    PingMessage,
    Pong,
    SessionConfigMessage,
    VideoDoneMessage,
    VideoFrameMessage,
    VideoQueryMessage,
    parse_message,
)
from .video_sink import VideoStreamSink

log = logging.getLogger("parley.realtime.websocket.video")

CONFIG_TIMEOUT_S = 10.0
FLUSH_TIMEOUT_S = 2.0
"""How long the goodbye (`session.done`) may take to go out before the socket closes."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_FRAME_BYTES = 10 * 1024 * 1024
MAX_AUDIO_BYTES = 4 * 1024 * 1024
OUTPUT_SAMPLE_RATE = 24_000
OVERFLOW_WARNING_INTERVAL_S = 1.0
MIN_QUERY_AUDIO_BYTES = MIN_COMMIT_MS * BYTES_PER_MS
SESSION_AUDIO_SECONDS = math.ceil(MAX_AUDIO_BYTES / (BYTES_PER_MS * 1000)) + 1
"""The session's audio buffer holds a little more than the window, so nothing in the
window is ever trimmed from it."""

CLOSE_NORMAL = 1000
CLOSE_INTERNAL_ERROR = 1011
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN = 1013

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


async def video_chat_stream(websocket: WebSocket) -> None:
    """The WebSocket route: authenticate, then one VideoChatStream for the connection."""
    services = websocket.app.state.services
    try:
        services.auth.check(websocket.headers.get("authorization"))
    except AuthError as exc:
        await websocket.close(CLOSE_POLICY, str(exc))
        return
    manager: SessionManager | None = services.manager
    if manager is None:
        await websocket.close(CLOSE_TRY_AGAIN, "the server is not ready yet")
        return
    await websocket.accept()
    await VideoChatStream(websocket, manager).run()


def _decoded_size(data: str) -> int:
    """An upper bound of what base64 `data` decodes to, without decoding it."""
    return len(data) * 3 // 4


def _pieces(pcm: bytes) -> list[bytes]:
    """`pcm` in pieces the session takes in one append."""
    return [pcm[i : i + MAX_APPEND_BYTES] for i in range(0, len(pcm), MAX_APPEND_BYTES)]


class VideoChatStream:
    """One connection: its settings, its audio window, its session and sink."""

    def __init__(self, websocket: WebSocket, manager: SessionManager) -> None:
        self._ws = websocket
        self._manager = manager
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

    async def run(self) -> None:
        try:
            config = await self._configure()
            if config is None:
                return
            self._config = config
            sink = VideoStreamSink(self._send, audio_output=config.audio_output)
            try:
                session = await self._manager.create(sink, session_settings(config))
            except ParleyError as exc:
                await self._report(str(exc), exc.code)
                limited = isinstance(exc, SessionLimitError)
                self._close_code = CLOSE_TRY_AGAIN if limited else CLOSE_POLICY
                return
            self._sink = sink
            await self._live(session, sink)
        finally:
            await self._close()

    # --- the socket ----------------------------------------------------------------------

    async def _send(self, message: Message) -> None:
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
                self._close_code, self._close_reason = None, "client_gone"
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
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await self._ws.close(self._close_code)

    # --- before the session --------------------------------------------------------------

    async def _configure(self) -> SessionConfigMessage | None:
        """Wait for the first valid message, which must be `session.config`."""
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
            if isinstance(message, SessionConfigMessage):
                return message
            await self._report(
                f"The first message must be session.config, not {message.type}",
                "config_required",
            )
            self._close_code = CLOSE_POLICY
            return None

    # --- the session's life --------------------------------------------------------------

    async def _live(self, session: Session, sink: VideoStreamSink) -> None:
        """Read the client's messages until it is done, it goes, or the session ends."""
        sid = session.session_id
        sender = asyncio.create_task(sink.run(), name=f"{sid}:video-send")
        reader = asyncio.create_task(self._serve(session, sink), name=f"{sid}:video-read")
        ended = asyncio.create_task(sink.session_closed.wait(), name=f"{sid}:video-ended")
        tasks = (sender, reader, ended)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in (reader, ended):
                task.cancel()
            await asyncio.wait({reader, ended})
            if sender.done():
                self._sender_ended(sender)
            elif not reader.cancelled() and reader.exception() is not None:
                log.error("video stream %s failed", sid, exc_info=reader.exception())
                self._close_code, self._close_reason = CLOSE_INTERNAL_ERROR, "server_error"
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
            await self._manager.close_session(sid, self._close_reason)

    def _sender_ended(self, sender: asyncio.Task[None]) -> None:
        error = None if sender.cancelled() else sender.exception()
        if isinstance(error, SlowClientError):
            log.warning("video stream: %s", error)
            self._close_code, self._close_reason = CLOSE_POLICY, "slow_client"
        else:  # the socket is gone: nothing more can be sent
            self._close_code, self._close_reason = None, "client_gone"

    async def _serve(self, session: Session, sink: VideoStreamSink) -> None:
        while True:
            raw = await self._receive()
            if raw is None:
                return
            try:
                if await self._handle(parse_message(raw), session, sink):
                    return
            except MessageError as exc:
                sink.send_message(ErrorMessage(message=str(exc), code=exc.code))
            except SessionClosedError:
                return
            except ParleyError as exc:
                sink.send_message(ErrorMessage(message=str(exc), code=exc.code))

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
