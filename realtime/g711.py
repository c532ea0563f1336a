"""G.711 (ITU-T): mu-law (`audio/pcmu`) and A-law (`audio/pcma`) <-> PCM16, with numpy.

8-bit logarithmic codings of 8 kHz telephone audio. The standard's segment tables are
applied to whole arrays at once (`searchsorted` finds each sample's segment), so a 20 ms
frame costs a few vectorised operations. The stdlib `audioop` did this until Python 3.13
removed it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Pcm = npt.NDArray[np.int16]

PCMU = "audio/pcmu"
PCMA = "audio/pcma"

_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159  # in 14-bit units
_ULAW_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def ulaw_encode(pcm: Pcm) -> bytes:
    value = pcm.astype(np.int32) >> 2  # 14-bit magnitude domain
    mask = np.where(value < 0, 0x7F, 0xFF)
    value = np.minimum(np.abs(value), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    segment = np.searchsorted(_ULAW_SEGMENT_ENDS, value)
    code = (segment << 4) | ((value >> (segment + 1)) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8).tobytes()


def ulaw_decode(data: bytes) -> Pcm:
    code = ~np.frombuffer(data, dtype=np.uint8).astype(np.int32) & 0xFF
    magnitude = (((code & 0x0F) << 3) + _ULAW_BIAS) << ((code & 0x70) >> 4)
    pcm = np.where(code & 0x80, _ULAW_BIAS - magnitude, magnitude - _ULAW_BIAS)
    return pcm.astype(np.int16)


def alaw_encode(pcm: Pcm) -> bytes:
    value = pcm.astype(np.int32) >> 3  # 13-bit
    negative = value < 0
    mask = np.where(negative, 0x55, 0xD5)
    value = np.where(negative, -value - 1, value)
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, value)
    shift = np.where(segment < 2, 1, segment)
    code = (segment << 4) | ((value >> shift) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8).tobytes()


def alaw_decode(data: bytes) -> Pcm:
    code = np.frombuffer(data, dtype=np.uint8).astype(np.int32) ^ 0x55
    segment = (code & 0x70) >> 4
    magnitude = ((code & 0x0F) << 4) + np.where(segment == 0, 8, 0x108)
    magnitude = np.where(segment > 1, magnitude << np.maximum(segment - 1, 0), magnitude)
    pcm = np.where(code & 0x80, magnitude, -magnitude)
    return pcm.astype(np.int16)


def encode(pcm: Pcm, fmt: str) -> bytes:
    """PCM16 (8 kHz) -> `audio/pcmu` or `audio/pcma` bytes."""
    if fmt == PCMU:
        return ulaw_encode(pcm)
    if fmt == PCMA:
        return alaw_encode(pcm)
    raise ValueError(f"not a G.711 format: {fmt!r}")


def decode(payload: bytes, fmt: str) -> Pcm:
    """`audio/pcmu` or `audio/pcma` bytes -> PCM16 (8 kHz)."""
    if fmt == PCMU:
        return ulaw_decode(payload)
    if fmt == PCMA:
        return alaw_decode(payload)
    raise ValueError(f"not a G.711 format: {fmt!r}")


class G711:
    """The codec a transport hands the client-event dispatcher (`G711Codec`)."""

    def decode(self, payload: bytes, fmt: str) -> bytes:
        return decode(payload, fmt).tobytes()

    def encode(self, pcm: Pcm, fmt: str) -> bytes:
        return encode(pcm, fmt)
