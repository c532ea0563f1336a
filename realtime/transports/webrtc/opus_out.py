"""Opus for the outbound track: mono, on the event loop, and silence for free.

aiortc encodes every frame a track hands it in the loop's default thread pool, silence
included: per call every 20 ms a pool job (a worker woken, then the loop woken back), a
resampling pass (mono to stereo) and a 96 kbit/s stereo encoding. A track that hands
aiortc an `av.Packet` is only packed, so the call's track encodes here instead: mono (the
answer is mono; a stereo decoder plays a mono Opus stream on both channels), on the loop.
Worker threads were tried (one frame per job, and every call's frames of a tick in one
batch): on this 2-core box under load a woken worker is often not
scheduled for tens of ms, and a frame waiting for it is late (webrtc_bench at 10 calls,
load average 6: 27 % late frames with a batch worker, 2.4 % with aiortc's pool, 1.1 %
encoding on the loop). The loop pays ~100-200 us per voiced frame instead.

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
        # libopus's default effort (complexity 10): at lower ones (5 tried) it never
        # settles into the 3-byte silence packet, and every silent frame would be coded.
        codec.options = {"application": "voip"}
        self._codec = codec
        self._frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        """Refilled for each frame (a fifth of the cost of a new one from an array): libopus
        copies a frame's samples as it codes it, and hands the packet back at once."""
        self._frame.sample_rate = SAMPLE_RATE
        self._frame.time_base = TIME_BASE
        self._silent: bytes | None = None
        """The encoder's packet for a silent frame once its state has decayed."""
        self._idle = False
        """True while silent frames are answered with the cached packet."""
        self.encoded = 0
        """Frames that went through the encoder (the others were cached silence)."""

    def packet(self, pcm: npt.NDArray[np.int16], pts: int, silent: bool) -> av.Packet[Stream]:
        """The packet for `pcm` (FRAME_SAMPLES samples) at `pts` (in samples); `silent`:
        the caller knows the frame is all zeros (its shared silence frame)."""
        if silent and self._idle and self._silent is not None:
            return _packet(self._silent, pts)
        data = self._encode(pcm, pts)
        if silent and data == self._silent:
            self._idle = True
        elif silent and self._silent is None and 0 < len(data) <= SILENT_PACKET_BYTES:
            self._silent, self._idle = data, True
        else:
            self._idle = False
        return _packet(data, pts)

    def _encode(self, pcm: npt.NDArray[np.int16], pts: int) -> bytes:
        frame = self._frame
        frame.planes[0].update(pcm.tobytes())
        frame.pts = pts
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
