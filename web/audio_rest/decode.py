"""An uploaded audio file, whatever its container, as the 16 kHz mono samples Whisper takes.

PyAV (FFmpeg) reads what OpenAI's transcription endpoint lists: wav, mp3, ogg/opus, webm,
flac, m4a/mp4/aac. The container is found from the bytes, not from the file name or its
Content-Type (clients send `file.wav` for anything). The whole file is decoded on a worker
thread: FFmpeg's decoders and the resampler are CPU work.
"""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt

from .errors import invalid

WHISPER_RATE = 16_000
FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")
"""What OpenAI's documentation lists; anything FFmpeg can read passes here."""

Samples = npt.NDArray[np.float32]


def decode_upload(data: bytes) -> Samples:
    """The first audio stream of `data` as float32 mono at WHISPER_RATE; AudioApiError
    (400, param `file`) when it is not audio FFmpeg can read."""
    refused = invalid(
        f"Invalid file format. Supported formats: {list(FORMATS)}", "file", "invalid_file_format"
    )
    if not data:
        raise invalid("The uploaded file is empty.", "file", "empty_file")
    import av  # FFmpeg: only an upload needs it (a GPU host's offline bundle has none)

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise refused
            resampler = av.AudioResampler(format="flt", layout="mono", rate=WHISPER_RATE)
            parts: list[Samples] = []
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1).astype(np.float32, copy=False))
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().reshape(-1).astype(np.float32, copy=False))
    except (av.FFmpegError, ValueError, IndexError, EOFError):
        raise refused from None
    if not parts:
        raise refused
    return np.concatenate(parts)
