"""Parley's audio formats: the one place their rates and frame sizes are defined.

Audio is PCM16 (16-bit little-endian, mono) everywhere inside Parley. What comes in is
resampled to one rate, 16 kHz, and cut into 20 ms frames: the rate the VAD, the speech
recogniser and the models' feature extractors take, and the packet time of a WebRTC
track, so one frame is one voice-activity decision and a barge-in takes effect within
one frame. What goes out is produced at the session's output rate (24 kHz unless the
client asks for another, as OpenAI's Realtime API does) and played out in 20 ms frames
too. The module sits in `pipeline`, the lowest package, so that engines, sessions and
transports all read the same numbers.
"""

from __future__ import annotations

from typing import Final

SAMPLE_BYTES = 2
"""PCM16: two bytes a sample."""

FRAME_MS = 20
"""One audio frame, in and out: a VAD decision, a WebRTC packet, a playout step."""

INPUT_SAMPLE_RATE = 16_000
"""Turn audio always reaches the pipeline as PCM16 mono at this rate."""
INPUT_FRAME_SAMPLES = INPUT_SAMPLE_RATE * FRAME_MS // 1000
INPUT_FRAME_BYTES = INPUT_FRAME_SAMPLES * SAMPLE_BYTES

SUPPORTED_INPUT_RATES = (8_000, 11_025, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000)
"""Client audio rates the input resampler takes."""

OUTPUT_SAMPLE_RATE: Final = 24_000
"""The default output rate: OpenAI Realtime's PCM rate, and the speech models' own."""
SUPPORTED_OUTPUT_RATES = (8_000, 16_000, 24_000, 48_000)


def frame_samples(sample_rate: int, frame_ms: int = FRAME_MS) -> int:
    """Samples in one frame of `frame_ms` at `sample_rate`."""
    return sample_rate * frame_ms // 1000
