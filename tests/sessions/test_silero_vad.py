"""Silero VAD as TurnDetector's voice detector on real (espeak-ng) speech: the same turns,
edges within the same 60 ms as webrtcvad's, and no turn from noise."""

from __future__ import annotations

import numpy as np

from loadtest.speech import utterances_with_gaps
from sessions.config import TurnDetectionConfig
from sessions.silero_vad import SileroVoice
from sessions.turn_detection import TurnDetector
from tests.sessions.test_turn_detection import SENTENCE_SETS, assert_edges, detect, frames_of, turns


def test_silero_finds_each_sentence_with_accurate_edges() -> None:
    pcm, expected = utterances_with_gaps(SENTENCE_SETS[2], gap_ms=800, lead_ms=700)
    detector = TurnDetector(TurnDetectionConfig(silence_duration_ms=500), SileroVoice())
    assert_edges(turns(detect(detector, frames_of(pcm))), expected)


def test_silero_starts_no_turn_on_noise() -> None:
    noise = np.random.default_rng(3).integers(-300, 301, 16_000 * 3).astype(np.int16)
    detector = TurnDetector(TurnDetectionConfig(), SileroVoice())
    assert detect(detector, frames_of(noise)) == []
