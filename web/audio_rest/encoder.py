"""24 kHz PCM16 to each of OpenAI's speech formats, encoded as it comes (a chunked stream).

`pcm` is the samples themselves (little-endian, mono, 24 kHz, as OpenAI documents it);
`wav` is a RIFF header written once with the lengths left at their maximum (the length of a
streamed answer is not known when its header goes out; FFmpeg, browsers and Python's
decoders read such a file to its end), then the samples. The compressed formats go through
PyAV (FFmpeg), into a sink that hands back whatever the muxer wrote after each piece:
`mp3` (LAME), `opus` (Opus in Ogg, as OpenAI sends it, a page every 20 ms rather than
FFmpeg's default of one a second so the stream flows), `aac` (ADTS frames) and `flac`.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
SPEECH_FORMATS: tuple[str, ...] = get_args(SpeechFormat)
MEDIA_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
CODECS: dict[str, tuple[str, str, dict[str, str]]] = {
    "mp3": ("mp3", "libmp3lame", {}),
    "opus": ("ogg", "libopus", {"page_duration": "20000"}),
    "aac": ("adts", "aac", {}),
    "flac": ("flac", "flac", {}),
}
"""Format -> (FFmpeg muxer, encoder, muxer options)."""

Pcm = npt.NDArray[np.int16]


class _Sink:
    """A write-only file for the muxer: what it wrote since the last `take()`."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        return len(chunk)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def wav_header(rate: int) -> bytes:
    """A PCM16 mono RIFF header whose lengths say "as long as the stream"."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", unknown)
    )


class SpeechEncoder:
    """Encodes one answer: `encode(pcm)` for each piece, `finish()` once; each returns the
    bytes ready to send. Blocking (FFmpeg): call it off the event loop for long pieces."""

    def __init__(self, form: SpeechFormat, rate: int) -> None:
        self.form = form
        self.rate = rate
        self._header_sent = False
        self._sink = _Sink()
        self._container: Any = None
        self._stream: Any = None
        if form in CODECS:
            import av  # FFmpeg: only an encoded answer needs it (not a GPU host's bundle)

            muxer, codec, options = CODECS[form]
            self._container = av.open(self._sink, mode="w", format=muxer, options=options)
            self._stream = self._container.add_stream(codec, rate=rate, layout="mono")
        self._samples = 0

    def encode(self, pcm: Pcm) -> bytes:
        if self._container is None:
            return self._raw(pcm)
        if len(pcm):
            import av

            frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = self.rate
            frame.pts = self._samples
            self._samples += len(pcm)
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        if self._container is None:
            return self._raw(np.zeros(0, np.int16))
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        self._container = None
        return self._sink.take()

    def close(self) -> None:
        """Let FFmpeg's state go without finishing the file (an abandoned answer)."""
        if self._container is not None:
            container, self._container = self._container, None
            with contextlib.suppress(Exception):  # its trailer may not write: nobody reads it
                container.close()

    def _raw(self, pcm: Pcm) -> bytes:
        body = pcm.astype("<i2", copy=False).tobytes()
        if self.form == "wav" and not self._header_sent:
            self._header_sent = True
            return wav_header(self.rate) + body
        return body
