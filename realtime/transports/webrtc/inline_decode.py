"""The caller's audio decoded on the event loop, not in a thread per call.

aiortc 1.16 gives every receiver a decoder thread: each RTP packet goes to it through a
`queue.Queue` (waking the thread), and each decoded frame comes back through
`run_coroutine_threadsafe` (waking the loop, and a task per frame). Decoding a 20 ms Opus
packet takes tens of microseconds; the two hand-offs cost the loop more than that, and
with tens of calls, tens of threads take the GIL from the loop fifty times a second each
(`loadtest/webrtc_bench --profile`: at 10 calls the queue's `notify` alone was ~18 % of
the loop's time).

`decode_inline(receiver)` hands an audio receiver, before it starts, a stand-in for that
queue: `put()` decodes on the spot and queues the frames on the track, as the thread would.
aiortc still starts its thread, which only waits, in `get()`, until the receiver stops
(`put(None)`), then ends the track as before. Video keeps its thread (decoding a picture
is real work). Like guards.py this stands on aiortc's internals: it checks them, and
leaves a receiver it does not recognise to aiortc. Delete when aiortc decodes audio inline.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import av
from aiortc import RTCRtpReceiver
from aiortc.codecs import get_decoder
from aiortc.jitterbuffer import JitterFrame

from . import guards

_QUEUE = "_RTCRtpReceiver__decoder_queue"
_THREAD = "_RTCRtpReceiver__decoder_thread"
_KIND = "_RTCRtpReceiver__kind"


class InlineDecoder:
    """Stands in for an audio receiver's decoder queue (see the module docstring)."""

    def __init__(self, frames: asyncio.Queue[Any]) -> None:
        self._frames = frames
        self._decoder: Any = None
        self._codec_name: str | None = None
        self._stopped = threading.Event()
        self.decoded = 0

    def put(self, task: tuple[Any, Any] | None) -> None:
        """On the loop: a (codec, encoded frame) to decode now, or None: the receiver stops."""
        if task is None:
            self._stopped.set()  # aiortc's thread wakes, ends the track and returns
            return
        codec, encoded = task
        if codec.name != self._codec_name:
            self._decoder, self._codec_name = get_decoder(codec), codec.name
        self._decode(codec.name, encoded)
        # frames the receive buffer released together (audio_jitter.HeldFrames), timed
        # after the first as the receiver timed it
        for data, after in getattr(encoded, "following", ()):
            self._decode(codec.name, JitterFrame(data, (encoded.timestamp + after) & 0xFFFFFFFF))

    def _decode(self, codec_name: str, encoded: JitterFrame) -> None:
        try:
            frames = self._decoder.decode(encoded)
        except av.FFmpegError as exc:  # keep the decoder's state, as aiortc does
            guards.count("decode", f"a {codec_name} frame failed to decode: {exc}")
            return
        for frame in frames:
            self._frames.put_nowait(frame)
            self.decoded += 1

    def get(self) -> None:
        """In aiortc's decoder thread: nothing to decode, wait for the stop."""
        self._stopped.wait()


def decode_inline(receiver: RTCRtpReceiver) -> bool:
    """Decode `receiver`'s audio on the loop from now on; False (nothing changed) if it is
    not an audio receiver that has yet to start, or aiortc is not the one we know."""
    try:
        kind = getattr(receiver, _KIND)
        started = getattr(receiver, _THREAD) is not None
        getattr(receiver, _QUEUE)
        frames = receiver.track._queue  # type: ignore[attr-defined]
    except AttributeError:
        return False
    if kind != "audio" or started or not isinstance(frames, asyncio.Queue):
        return False
    setattr(receiver, _QUEUE, InlineDecoder(frames))
    return True
