"""The call's outbound audio: one track that plays the session's output in real time.

aiortc pulls `recv()` for each packet; we hand it the next 20 ms frame of the call's
playout engine (`sessions.playout.PlayoutBuffer`) at its due time (silence when nothing is
queued or playback is paused, so the stream never stalls). The engine keeps the rules:
clearing it takes effect at the next frame, and it resamples the session's output (24 kHz
by default) to 48 kHz as one stream per answer. Edges between silence and speech are
reported, which is what OpenAI's `output_audio_buffer.started` / `stopped` events describe
on WebRTC.

A call that sends Opus (what nearly every peer offers first) has the track hand aiortc
ready packets (`encode_opus()`, see opus_out.py): mono, encoded on the loop with no thread
hand-off, and silence costs a cached packet, no encoding at all. Other
codecs (PCMU, PCMA) get frames, which aiortc encodes in its thread pool.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable

import av
from aiortc import MediaStreamTrack
from aiortc.sdp import SessionDescription
from av.stream import Stream

from pipeline.audio_format import FRAME_MS
from sessions import PlayoutBuffer

from .opus_out import OpusPacketizer

OUTPUT_RATE = 48_000
"""Opus runs at 48 kHz: playing out at that rate spares aiortc a resampling step."""


def sends_opus(answer_sdp: str) -> bool:
    """Whether the audio sender of the call whose answer is `answer_sdp` sends Opus:
    aiortc's sender uses the first codec of the answer's audio m-line."""
    for media in SessionDescription.parse(answer_sdp).media:
        if media.kind == "audio" and media.rtp.codecs:
            return media.rtp.codecs[0].mimeType.lower() == "audio/opus"
    return False


class OutboundAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(
        self,
        playout: PlayoutBuffer,
        on_start: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None,
        on_frame: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__()
        if playout.sample_rate != OUTPUT_RATE or playout.piece_ms != FRAME_MS:
            raise ValueError("the outbound track plays a 48 kHz playout buffer of 20 ms frames")
        self.playout = playout
        self._on_start = on_start
        self._on_stop = on_stop
        self._on_frame = on_frame
        self._start: float | None = None
        self._pts = 0
        self._speaking = False
        self.frames_sent = 0
        self.last_audio_at: float | None = None
        self._time_base = fractions.Fraction(1, OUTPUT_RATE)
        self._opus: OpusPacketizer | None = None

    def encode_opus(self) -> None:
        """Hand aiortc Opus packets from now on (the call's sender negotiated Opus)."""
        if self._opus is None:
            self._opus = OpusPacketizer()

    async def recv(self) -> av.AudioFrame | av.Packet[Stream]:
        if self.readyState != "live":
            raise ConnectionError("the outbound track has ended")
        samples = self.playout.frame_samples
        if self._start is None:
            self._start = time.monotonic()
            due = self._start
        else:
            self._pts += samples
            due = self._start + self._pts / OUTPUT_RATE
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        if self._on_frame is not None:
            self._on_frame(time.monotonic() - due)
        pcm = self.playout.next_frame()
        audible = pcm is not self.playout.silence
        if audible:
            self.last_audio_at = time.monotonic()
        if audible != self._speaking:
            self._speaking = audible
            callback = self._on_start if audible else self._on_stop
            if callback is not None:
                callback()
        self.frames_sent += 1
        if self._opus is not None:
            return self._opus.packet(pcm, self._pts, not audible)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUTPUT_RATE
        frame.pts = self._pts
        frame.time_base = self._time_base
        return frame
