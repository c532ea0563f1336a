"""Smart Turn v3.2 on real speech: a whole question sounds more finished than the same
question broken off mid-sentence (the Piper voice's own audio of the whole sentence, cut at
a word by its phoneme alignment, so the cut part keeps the pitch of a sentence going on)."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.speech_set import Pcm, piper_speaker
from loadtest.turn_end_set import piper_cutter, trimmed
from sessions import smart_turn

QUESTION = "What is the capital of France?"


def heard_at_a_pause(voice: Pcm) -> Pcm:
    """What the session has at a pause: some lead-in, the voice, 160 ms of silence."""
    return np.concatenate([np.zeros(4_800, np.int16), voice, np.zeros(2_560, np.int16)])


@pytest.mark.slow  # loads Piper (~2 s)
def test_a_whole_question_sounds_more_finished_than_one_broken_off() -> None:
    model = smart_turn.shared()
    assert model is not None, "pipecat-ai (a test dependency) ships the model"
    assert smart_turn.shared() is model  # loaded once per process
    whole = model.probability(heard_at_a_pause(trimmed(piper_speaker()(QUESTION))))
    cut = piper_cutter()
    broken = [model.probability(heard_at_a_pause(trimmed(cut(QUESTION, n)[0]))) for n in (4, 5)]
    assert whole >= smart_turn.THRESHOLD
    assert all(whole > p for p in broken), (whole, broken)
    assert min(broken) < smart_turn.THRESHOLD


def test_the_input_is_the_last_8_seconds_as_80_by_800_log_mel_bands() -> None:
    rng = np.random.default_rng(1)
    long = rng.integers(-3_000, 3_000, 16_000 * 12).astype(np.int16)
    features = smart_turn.features(long)
    assert features.shape == (80, 800) and features.dtype == np.float32
    assert np.array_equal(features, smart_turn.features(long[-16_000 * 8 :]))
    assert np.all(features <= 1.5) and np.all(features >= features.max() - 2.0 - 1e-6)
