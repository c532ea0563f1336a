"""The server's receive buffer hands each audio packet over as it arrives, not with the
next one; it still puts packets back in order, waits a bounded while for a missing one,
and loses nothing it held: frames released together are all decoded, in order. (That a
call's receiver has this buffer is checked in test_inline_decode.py, on a real call.)"""

from __future__ import annotations

import asyncio
import fractions

import av
import numpy as np
from aiortc import RTCRtpCodecParameters
from aiortc.codecs import get_encoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtp import RtpPacket

from realtime.transports.webrtc.audio_jitter import (
    GAP_WAIT_PACKETS,
    AudioJitterBuffer,
    HeldFrames,
)
from realtime.transports.webrtc.inline_decode import InlineDecoder

STEP = 960
"""RTP timestamp ticks in a 20 ms Opus packet."""


def packet(seq: int, payload: bytes = b"x") -> RtpPacket:
    """A 20 ms Opus packet as the receiver hands it to the buffer (depayloaded: `_data`)."""
    rtp = RtpPacket(
        payload_type=111, sequence_number=seq & 0xFFFF, timestamp=(STEP * seq) & 0xFFFFFFFF
    )
    rtp._data = payload  # type: ignore[attr-defined]
    return rtp


def numbers(frame: JitterFrame | None) -> list[int]:
    """The packets (by timestamp) a released frame carries, the first and its following."""
    if frame is None:
        return []
    following = frame.following if isinstance(frame, HeldFrames) else []
    return [frame.timestamp // STEP] + [(frame.timestamp + after) // STEP for _, after in following]


def released(buffer: AudioJitterBuffer, seqs: list[int]) -> list[list[int]]:
    """For each packet added in turn: the packets that came out with it."""
    return [numbers(buffer.add(packet(seq))[1]) for seq in seqs]


def test_each_packet_in_order_comes_out_as_it_arrives() -> None:
    assert released(AudioJitterBuffer(), [1, 2, 3, 4]) == [[1], [2], [3], [4]]


def test_across_the_sequence_numbers_wrap_each_packet_still_comes_out_at_once() -> None:
    buffer = AudioJitterBuffer()
    out = [buffer.add(packet(seq))[1] for seq in (65534, 65535, 65536, 65537)]
    assert [f is not None and not isinstance(f, HeldFrames) for f in out] == [True] * 4


def test_a_reordered_packet_is_waited_for_then_both_come_out_in_order() -> None:
    buffer = AudioJitterBuffer()
    assert released(buffer, [1, 3, 2, 4]) == [[1], [], [2, 3], [4]]
    assert buffer.lost == 0


def test_a_lost_packet_is_passed_over_after_a_bounded_wait_and_nothing_held_is_dropped() -> None:
    buffer = AudioJitterBuffer()
    after_gap = list(range(3, 3 + GAP_WAIT_PACKETS))
    out = released(buffer, [1, *after_gap, 3 + GAP_WAIT_PACKETS])
    assert out == [[1], *[[]] * (GAP_WAIT_PACKETS - 1), after_gap, [3 + GAP_WAIT_PACKETS]]
    assert buffer.lost == 1
    assert released(buffer, [2]) == [[]]  # too late: its place was given up


def test_a_duplicate_is_dropped() -> None:
    assert released(AudioJitterBuffer(), [1, 2, 2, 3]) == [[1], [2], [], [3]]


def test_a_jump_far_ahead_releases_what_was_held_then_goes_on_from_there() -> None:
    buffer = AudioJitterBuffer()
    assert released(buffer, [1, 3, 40, 41]) == [[1], [], [3, 40], [41]]


def test_a_sender_that_numbers_again_from_far_behind_is_followed() -> None:
    buffer = AudioJitterBuffer()
    assert released(buffer, [5000, 5001, 100, 101]) == [[5000], [5001], [100], [101]]


def test_frames_released_together_are_each_decoded_in_order() -> None:
    """Real Opus: the run after a reordered packet decodes to every frame, timed apart."""
    codec = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2)
    encoder = get_encoder(codec)
    payloads: list[bytes] = []
    for k in range(3):
        tone = (8000 * np.sin(np.arange(960) * (k + 1) * 0.05)).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(tone.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = 48000, k * STEP
        frame.time_base = fractions.Fraction(1, 48000)
        (payload,), _ = encoder.encode(frame)
        payloads.append(payload)
    buffer = AudioJitterBuffer()
    frames: asyncio.Queue[av.AudioFrame] = asyncio.Queue()
    decoder = InlineDecoder(frames)
    for seq in (0, 2, 1):  # the second and third come out together
        _, ready = buffer.add(packet(seq, payloads[seq]))
        if ready is not None:
            decoder.put((codec, ready))
    assert decoder.decoded == 3
    pts = [frames.get_nowait().pts for _ in range(3)]
    assert pts == [0, STEP, 2 * STEP]
