"""Draining the caller's tracks into the session, whatever the session is doing.

An aiortc track that nobody reads queues decoded frames without bound, so each inbound
track gets one drain task for the life of the call. Audio goes to the call's `hear` (the
session, or a duplex model) as it comes, already 16 kHz mono (mic.py: decoded Opus is 48
kHz stereo). Video is sampled: one frame per `1/fps` seconds (faster while the user
speaks), JPEG-encoded off the event loop, into the session's frame cache, stamped on the
session's clock by its RTP timestamp (frame_clock.py); the frames in between are read and
dropped.

A drain outlives any one bad frame: a frame that cannot be converted, or that the session
refuses, is counted (`guards.count`, rate-limited in the log) and the drain reads on. A
drain that died would leave the track unread, and aiortc would queue it without bound.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable

import av
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from sessions import ParleyError, Session, SessionClosedError, SessionState
from sessions.audio_arrivals import wall_ms

from . import guards
from .frame_clock import FrameClock
from .mic import MicConverter

JPEG_QUALITY = 80
MAX_WIDTH = 640


async def drain_audio(
    track: MediaStreamTrack, session: Session, hear: Callable[[bytes], Awaitable[None]]
) -> None:
    """The track's audio, 16 kHz mono PCM16, to `hear` (the call's: to the session, or to
    a duplex model)."""
    mic = MicConverter()
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        try:
            if not isinstance(frame, av.AudioFrame):
                raise ValueError(f"not an audio frame: {type(frame).__name__}")
            pcm = mic.convert(frame)
        except (ValueError, av.FFmpegError) as exc:
            guards.count("frame", f"an audio frame could not be converted: {exc}")
            continue
        if not pcm:
            continue  # the resampler's block is not full yet
        try:
            await hear(pcm)
        except SessionClosedError:
            continue  # keep draining until the track ends
        except ParleyError as exc:
            guards.count("refused", f"session {session.session_id} refused audio: {exc}")


def encode_jpeg(frame: av.VideoFrame) -> bytes:
    image = frame.to_image()  # type: ignore[no-untyped-call]
    if image.width > MAX_WIDTH:
        image = image.resize((MAX_WIDTH, round(image.height * MAX_WIDTH / image.width)))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


async def drain_video(
    track: MediaStreamTrack, session: Session, fps: Callable[[bool], float]
) -> None:
    """`fps(speaking)` gives the sampling rate for the current moment."""
    next_at, clock = 0.0, FrameClock()
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        # Every frame, sampled or not, is timed: the fastest to arrive sets the offset.
        video = isinstance(frame, av.VideoFrame)
        taken_ms = clock.stamp(frame.pts, frame.time_base, wall_ms()) if video else 0
        now = time.monotonic()
        if now < next_at:
            continue
        next_at = now + 1.0 / max(0.01, fps(session.state is SessionState.USER_SPEAKING))
        if not isinstance(frame, av.VideoFrame):
            guards.count("frame", f"not a video frame: {type(frame).__name__}")
            continue
        try:
            jpeg = await asyncio.to_thread(encode_jpeg, frame)
        except Exception as exc:  # PIL and PyAV raise many kinds for a frame they cannot use
            guards.count("frame", f"a video frame could not be encoded: {exc!r}")
            continue
        try:
            await session.add_frame(jpeg, taken_ms)
        except SessionClosedError:
            continue
        except ParleyError as exc:
            guards.count("refused", f"session {session.session_id} refused a frame: {exc}")
