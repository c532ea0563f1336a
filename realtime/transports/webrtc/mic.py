"""The caller's decoded audio, turned into the session's own format on the way in.

aiortc decodes Opus to 48 kHz interleaved stereo (the same voice on both channels, for a
microphone); the session wants 16 kHz mono. Handing it the decoded frame as it is makes
the session's general resampler downmix in float, filter in float and convert back, per
20 ms frame per call: one of the largest items on the event loop with tens of calls. Here
one soxr stream per call filters PCM16 mono directly (soxr converts in C), after an
integer downmix, so the session receives 16 kHz mono and only cuts it into frames.

soxr hands out its output in blocks, so a frame may yield nothing (the next yields more);
nothing is lost, and `convert` returns b"" then.
"""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt
import soxr

from sessions.resample import SAMPLE_RATE


class MicConverter:
    """Decoded audio frames of one track in, 16 kHz mono PCM16 out (one stream)."""

    def __init__(self) -> None:
        self._stream: soxr.ResampleStream | None = None
        self._from_rate = 0

    def convert(self, frame: av.AudioFrame) -> bytes:
        """16 kHz mono PCM16 for `frame` (maybe b"": soxr's block is not full yet).
        Raises ValueError (or av.FFmpegError) for a frame it cannot read."""
        mono = _mono(frame)
        rate = frame.sample_rate
        if rate == SAMPLE_RATE:
            self._stream = None
            return mono.tobytes()
        if self._stream is None or rate != self._from_rate:
            # A new rate (a renegotiated codec) starts a new stream: the old one's few ms
            # of look-ahead are dropped, which no listener can tell.
            self._stream = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="int16")
            self._from_rate = rate
        out: npt.NDArray[np.int16] = self._stream.resample_chunk(mono)
        return out.tobytes()


def _mono(frame: av.AudioFrame) -> npt.NDArray[np.int16]:
    if frame.format.name != "s16":  # planar or float: let FFmpeg pack it as PCM16
        resampler = av.AudioResampler(
            format="s16", layout=frame.layout.name, rate=frame.sample_rate
        )
        (frame,) = resampler.resample(frame)
    channels = frame.layout.nb_channels
    # The plane may be padded past the samples: read exactly the frame's samples.
    pcm = np.frombuffer(memoryview(frame.planes[0]), dtype=np.int16, count=frame.samples * channels)
    if channels == 1:
        return pcm
    if channels == 2:  # what aiortc's Opus decoder gives: a few array operations, no reduction
        mixed: npt.NDArray[np.int16] = ((pcm[0::2].astype(np.int32) + pcm[1::2]) >> 1).astype(
            np.int16
        )
        return mixed
    interleaved = pcm.reshape(-1, channels).astype(np.int32)
    averaged: npt.NDArray[np.int16] = (interleaved.sum(axis=1) // channels).astype(np.int16)
    return averaged
