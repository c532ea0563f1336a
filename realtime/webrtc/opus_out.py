"""Opus for the outbound track: mono, off the event loop, and silence for free.

aiortc encodes every frame a track hands it in the loop's default thread pool, silence
included: a pool job with its thread hand-offs on the loop per call every 20 ms, a
resampling pass (mono to stereo) and a 96 kbit/s stereo encoding. A track that hands
aiortc an `av.Packet` is only packed, so the call's track encodes here instead: mono (the
answer is mono; a stereo decoder plays a mono Opus stream on both channels), in worker
threads still (libopus takes 100-200 us a frame on this kind of machine: on the loop,
with tens of calls, that is what makes frames late; measured in loadtest/webrtc_bench).

Between answers the track plays digital silence, which Opus codes as a 3-byte packet
once the encoder's state has decayed: from the moment the encoder itself produces that
packet for a silent frame, silent frames cost nothing but that cached packet, until sound
comes again (which the encoder then takes up from its silent state).
"""

from __future__ import annotations

import fractions

import av
import numpy as np
import numpy.typing as npt
from av.stream import Stream

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960
BIT_RATE = 48_000
"""Mono speech at 48 kbit/s: transparent for a voice, half what aiortc sends in stereo."""
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
SILENT_PACKET_BYTES = 3
"""libopus codes digital silence, once its state has decayed, as a TOC byte and two more."""


class OpusPacketizer:
    """20 ms frames of 48 kHz mono PCM16 in, one Opus `av.Packet` per frame out."""

    def __init__(self, bit_rate: int = BIT_RATE) -> None:
        codec = av.CodecContext.create("libopus", "w")
        assert isinstance(codec, av.AudioCodecContext)
        codec.bit_rate = bit_rate
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = SAMPLE_RATE
        codec.time_base = TIME_BASE
        codec.options = {"application": "voip"}
        self._codec = codec
        self._silent: bytes | None = None
        """The encoder's packet for a silent frame once its state has decayed."""
        self._idle = False
        """True while silent frames are answered with the cached packet."""
        self.encoded = 0
        """Frames that went through the encoder (the others were cached silence)."""

    def cached(self, pts: int, silent: bool) -> av.Packet[Stream] | None:
        """The packet for a silent frame at `pts` when it needs no encoding, else None."""
        if silent and self._idle and self._silent is not None:
            return _packet(self._silent, pts)
        return None

    def encode(self, pcm: npt.NDArray[np.int16], pts: int, silent: bool) -> av.Packet[Stream]:
        """The packet for `pcm` (FRAME_SAMPLES samples) at `pts` (in samples); `silent`:
        the caller knows the frame is all zeros. Runs in a worker thread (one call at a
        time per packetizer: a track awaits each frame before the next)."""
        data = self._encode(pcm, pts)
        if silent and data == self._silent:
            self._idle = True
        elif silent and self._silent is None and 0 < len(data) <= SILENT_PACKET_BYTES:
            self._silent, self._idle = data, True
        else:
            self._idle = False
        return _packet(data, pts)

    def _encode(self, pcm: npt.NDArray[np.int16], pts: int) -> bytes:
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = pts
        frame.time_base = TIME_BASE
        self.encoded += 1
        packets = self._codec.encode(frame)
        # libopus codes each 20 ms frame into exactly one packet, at once (its look-ahead
        # is declared as a pts offset, not held back); join defensively all the same.
        return b"".join(bytes(p) for p in packets)


def _packet(data: bytes, pts: int) -> av.Packet[Stream]:
    packet = av.Packet(data)
    packet.pts = pts
    packet.time_base = TIME_BASE
    return packet
