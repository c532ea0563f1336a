"""A stored GPT-Live session's recording (realtime/live/live_recording.py): both sides on
one timeline, bounded, as a stereo WAV; on a fake clock."""

from __future__ import annotations

import io
import wave

import numpy as np

from realtime.live.live_recording import RATE, LiveRecording, wav


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tone(seconds: float, rate: int, level: int = 8000) -> np.ndarray:
    n = int(seconds * rate)
    return (level * np.sin(np.arange(n) * 2 * np.pi * 440 / rate)).astype(np.int16)


def stereo(recording: LiveRecording) -> np.ndarray:
    return np.frombuffer(recording.pcm(), "<i2").reshape(-1, 2)


def test_each_side_lands_where_it_was_said_on_the_timeline() -> None:
    clock = Clock()
    recording = LiveRecording(60, clock)
    recording.hear(tone(1.0, 24_000).tobytes(), 24_000)  # the user, at once
    clock.now = 2.0
    recording.said(tone(1.0, 16_000), 16_000)  # the answer, two seconds in
    clock.now = 3.5
    both = stereo(recording)
    assert len(both) == int(3.5 * RATE)  # as long as the session
    user, model = both[:, 0], both[:, 1]
    assert np.abs(user[: RATE - 100]).max() > 4000 and not user[RATE + 100 :].any()
    assert not model[: 2 * RATE].any() and np.abs(model[2 * RATE : 3 * RATE]).max() > 4000


def test_the_cap_keeps_the_first_seconds_and_counts_the_rest() -> None:
    clock = Clock()
    recording = LiveRecording(1.0, clock)
    recording.said(tone(1.5, RATE), RATE)
    clock.now = 10.0
    recording.hear(tone(0.5, RATE), RATE)  # past the cap: dropped
    assert len(stereo(recording)) == RATE
    assert recording.dropped_ms == 500


def test_a_wav_file_of_two_channels_at_16_khz() -> None:
    recording = LiveRecording(5, Clock())
    recording.hear(tone(0.5, RATE), RATE)
    with wave.open(io.BytesIO(wav(recording.pcm()))) as file:
        assert (file.getnchannels(), file.getsampwidth(), file.getframerate()) == (2, 2, RATE)
        assert file.getnframes() == RATE // 2
