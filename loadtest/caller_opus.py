"""Opus for the load-test caller's microphone, encoded once and shared by every caller.

A bench process runs tens of aiortc callers on the same cores as the server under test.
Handed PCM frames, aiortc encodes each 20 ms frame of each caller in its thread pool
(stereo, 96 kbit/s), silence included: the callers then use more CPU than the server and
the server's late frames measure the callers' load. Handed `av.Packet`s, aiortc only packs
them. So the caller's microphone sends packets from here: silence is one cached packet
(what libopus codes digital silence as, once its state has decayed), and an utterance is
encoded once (mono, as the server's own outbound track does: realtime/transports/webrtc/opus_out.py)
and its packets are replayed by every caller that says it.
"""

from __future__ import annotations

import fractions
import hashlib
from collections import OrderedDict

import av
import numpy as np
import numpy.typing as npt
import soxr
from av.stream import Stream

from realtime.transports.webrtc.opus_out import OpusPacketizer

RATE = 48_000
FRAME = 960
TIME_BASE = fractions.Fraction(1, RATE)
CACHED_UTTERANCES = 64
"""Distinct utterances kept encoded (a bench says a handful of sentences, over and over)."""

_cache: OrderedDict[bytes, tuple[bytes, ...]] = OrderedDict()


def to_48k(pcm16k: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    """PCM16 mono 16 kHz to 48 kHz (the rate Opus is carried at)."""
    out: npt.NDArray[np.int16] = soxr.resample(pcm16k, 16_000, RATE).astype(np.int16)
    return out


def utterance_packets(pcm: npt.NDArray[np.int16], rate: int = 16_000) -> tuple[bytes, ...]:
    """The Opus packets (one per 20 ms, the last frame padded with silence) of `pcm`
    (PCM16 mono at `rate`: 16 or 48 kHz), encoded the first time it is said and cached by
    its content."""
    pcm = np.ascontiguousarray(pcm, dtype=np.int16)
    key = hashlib.blake2b(pcm.tobytes() + rate.to_bytes(4, "little")).digest()
    packets = _cache.get(key)
    if packets is not None:
        _cache.move_to_end(key)
        return packets
    if rate != RATE:
        pcm = to_48k(pcm)
    pcm = np.concatenate([pcm, np.zeros(-len(pcm) % FRAME, dtype=np.int16)])
    encoder = OpusPacketizer()
    packets = tuple(
        bytes(encoder.packet(pcm[i : i + FRAME], i, silent=False))
        for i in range(0, len(pcm), FRAME)
    )
    _cache[key] = packets
    while len(_cache) > CACHED_UTTERANCES:
        _cache.popitem(last=False)
    return packets


def packet(data: bytes, pts: int) -> av.Packet[Stream]:
    """An Opus packet for aiortc's sender: `pts` in samples at 48 kHz."""
    out = av.Packet(data)
    out.pts = pts
    out.time_base = TIME_BASE
    return out
