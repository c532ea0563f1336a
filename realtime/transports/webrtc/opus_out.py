"""Opus for the outbound track: mono, coded in the call's process, and silence for free.

aiortc encodes every frame a track hands it in the loop's default thread pool, silence
included: per call every 20 ms a pool job (a worker woken, then the loop woken back), a
resampling pass (mono to stereo) and a 96 kbit/s stereo encoding. A track that hands
aiortc an `av.Packet` is only packed, so the call's track encodes here instead: mono (the
answer is mono; a stereo decoder plays a mono Opus stream on both channels), on the loop.
Worker threads were tried (one frame per job, and every call's frames of a tick in one
batch): on this 2-core box under load a woken worker is often not scheduled for tens of
ms, and a frame waiting for it is late (webrtc_bench at 10 calls, load average 6: 27 %
late frames with a batch worker, 2.4 % with aiortc's pool, 1.1 % encoding on the loop).
Coding each voiced frame a frame ahead on one polling thread, so that no frame waited for
it (2026-12-06), took ~70 us a frame off the loop but cost ~200 us more CPU a frame in all
(the thread's Python holds the GIL the loop wants) and gave more late frames: webrtc_bench
one process, 20 calls, callers at nice 10, two runs each: 992 / 999 us of CPU per outbound
frame against 784 / 814 coding on the loop, late frames 1.77 / 0.37 % against 0.00 /
0.01 %, barge-in p95 211 / 207 ms against 203 / 199. The loop pays ~100-300 us per voiced
frame instead.

Between answers the track plays digital silence. libopus codes it as a 3-byte packet only
after a pure tone; after speech it goes on coding 55-byte frames (22 kbit/s of silence),
and a fresh encoder does the same: every silent frame cost a coding (60 % of a call's
frames in webrtc_bench). So once `TAIL_FRAMES` silent frames have been coded after a sound
(its tail), silent frames are `silent_packet()` (the 3-byte packet, learnt once per
process from an encoder primed with a tone) and the encoder is left alone until sound
comes again, which it takes up from its silent state. A new call's silence is that packet
from its first frame: nothing is coded until its first answer.
"""

from __future__ import annotations

import fractions
import functools

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
SETTLE_FRAMES = 50
"""Silent frames an encoder may take to settle into its silence packet (it takes ~5)."""
TAIL_FRAMES = 3
"""Silent frames coded after sound (its tail: libopus's 6.5 ms look-ahead and its
prediction's decay) before silence is the cached packet."""


class OpusPacketizer:
    """20 ms frames of 48 kHz mono PCM16 in, one Opus `av.Packet` per frame out."""

    def __init__(self, bit_rate: int = BIT_RATE, *, quiet: bool = True) -> None:
        """`quiet`: silent frames are the cached packet until the first sound (a track);
        else they are coded from the start."""
        codec = av.CodecContext.create("libopus", "w")
        assert isinstance(codec, av.AudioCodecContext)
        codec.bit_rate = bit_rate
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = SAMPLE_RATE
        codec.time_base = TIME_BASE
        # libopus's default effort (complexity 10): at lower ones (5 tried) it never
        # settles into the 3-byte silence packet that `silent_packet()` learns.
        codec.options = {"application": "voip"}
        self._codec = codec
        self._frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        """Refilled for each frame (a fifth of the cost of a new one from an array): libopus
        copies a frame's samples as it codes it, and hands the packet back at once."""
        self._frame.sample_rate = SAMPLE_RATE
        self._frame.time_base = TIME_BASE
        self._silent: bytes | None = silent_packet() if quiet else None
        """The packet sent for a silent frame once the sound's tail is coded (None: every
        frame is coded, as for `silent_packet()` itself)."""
        self._tail = TAIL_FRAMES if quiet else 0
        """Silent frames coded since the last sound (a quiet start counts as settled)."""
        self.encoded = 0
        """Frames that went through the encoder (the others were cached silence)."""

    def packet(self, pcm: npt.NDArray[np.int16], pts: int, silent: bool) -> av.Packet[Stream]:
        """The packet for `pcm` (FRAME_SAMPLES samples) at `pts` (in samples); `silent`:
        the caller knows the frame is all zeros (its shared silence frame). Once
        `TAIL_FRAMES` silent frames have been coded after sound, silence is the cached
        packet."""
        if silent and self._tail >= TAIL_FRAMES and self._silent is not None:
            return _packet(self._silent, pts)
        self._tail = self._tail + 1 if silent else 0
        return _packet(self.encode(pcm), pts)

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """The encoder's packet for the next frame, `pcm`."""
        frame = self._frame
        frame.planes[0].update(pcm.tobytes())
        frame.pts = self.encoded * FRAME_SAMPLES  # the encoder's own count: never repeats
        self.encoded += 1
        packets = self._codec.encode(frame)
        # libopus codes each 20 ms frame into exactly one packet, at once (its look-ahead
        # is declared as a pts offset, not held back); join defensively all the same.
        return b"".join(bytes(p) for p in packets)


@functools.cache
def silent_packet() -> bytes:
    """libopus's packet for a silent frame, once its state has settled after sound (an
    encoder primed with a tone, then fed zeros until its packets are this small)."""
    opus = OpusPacketizer(quiet=False)
    t = np.arange(FRAME_SAMPLES) / SAMPLE_RATE
    tone = np.rint(3000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    for _ in range(5):
        opus.encode(tone)
    zeros = np.zeros(FRAME_SAMPLES, dtype=np.int16)
    for _ in range(SETTLE_FRAMES):
        data = opus.encode(zeros)
        if 0 < len(data) <= SILENT_PACKET_BYTES:
            return data
    raise RuntimeError(f"libopus did not settle into a silence packet in {SETTLE_FRAMES} frames")


def _packet(data: bytes, pts: int) -> av.Packet[Stream]:
    packet = av.Packet(data)
    packet.pts = pts
    packet.time_base = TIME_BASE
    return packet
