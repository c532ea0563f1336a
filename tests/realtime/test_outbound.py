"""The outbound WebRTC track: 20 ms frames of the playout engine at 48 kHz, in real time,
silence between answers, and the edges between the two reported."""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt
import pytest
import soxr

from realtime.transports.webrtc.outbound import OUTPUT_RATE, OutboundAudioTrack
from sessions.playout import PlayoutBuffer


def sine(rate: int, seconds: float, hz: float = 330.0) -> npt.NDArray[np.int16]:
    t = np.arange(round(rate * seconds)) / rate
    pcm: npt.NDArray[np.int16] = np.rint(12_000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)
    return pcm


async def test_an_answer_plays_as_one_48k_stream_between_silences() -> None:
    playout = PlayoutBuffer(OUTPUT_RATE)
    edges: list[str] = []
    track = OutboundAudioTrack(playout, lambda: edges.append("start"), lambda: edges.append("stop"))
    try:
        answer = sine(24_000, 0.1)
        for start in range(0, len(answer), 700):  # the model's chunks, at 24 kHz
            await playout.write(answer[start : start + 700], 24_000)
        received = [await track.recv() for _ in range(9)]
    finally:
        track.stop()
    frames = [f for f in received if isinstance(f, av.AudioFrame)]  # a track not set to Opus
    assert len(frames) == 9
    assert all(f.sample_rate == OUTPUT_RATE and f.samples == 960 for f in frames)
    assert [f.pts for f in frames] == [960 * i for i in range(9)]
    pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
    whole = soxr.resample(answer, 24_000, OUTPUT_RATE)
    assert np.abs(pcm[: len(whole)].astype(np.int32) - whole).max() <= 2  # no seams
    assert not pcm[len(whole) :].any()
    assert edges == ["start", "stop"]
    assert playout.played_ms == 100 and track.frames_sent == 9


def test_the_track_plays_only_a_48k_playout() -> None:
    with pytest.raises(ValueError, match="48 kHz"):
        OutboundAudioTrack(PlayoutBuffer(24_000))
