"""PCM16 -> a complete little WAV file, for protocols that ship audio as WAV deltas."""

from __future__ import annotations

import io
import wave

import numpy as np
import numpy.typing as npt


def wav_bytes(pcm: npt.NDArray[np.int16], sample_rate: int) -> bytes:
    """`pcm` (mono) as a RIFF/WAVE file: a 44-byte header, then the samples."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(sample_rate)
        writer.writeframes(pcm.astype("<i2", copy=False).tobytes())
    return buffer.getvalue()
