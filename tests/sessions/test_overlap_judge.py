"""The judge of speech over an answer, rule by rule (overlap_judge.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sessions.overlap_judge import BackchannelRules, Overlap, Verdict

KEEP, INTERRUPT = Verdict.KEEP, Verdict.INTERRUPT


def judged(words: str | None, voiced_ms: int = 400, stopped: bool = True) -> Verdict | None:
    return BackchannelRules().judge(Overlap(voiced_ms, stopped, words, min_speech_ms=200))


@pytest.mark.parametrize(
    "words",
    [
        "uh-huh",
        "Uh uh",
        "Yeah.",
        "Right!",
        "okay",
        "OK",
        "Mm-hmm.",
        "Mhm",
        "I see.",
        "Yeah, right.",
        "MMI.",  # how Whisper writes espeak-ng's "mm-hmm"
        "M-M-M.",
    ],
)
def test_a_backchannel_keeps_the_answer(words: str) -> None:
    assert judged(words) is KEEP


@pytest.mark.parametrize("words", ["", "[cough]", "(coughs)", " ... "])
def test_no_words_is_a_noise(words: str) -> None:
    assert judged(words) is KEEP


@pytest.mark.parametrize(
    "words",
    [
        "Wait, stop!",
        "Stop",
        "No, I meant Tuesday.",
        "Yeah, but what about the price?",
        "okay so",
        "yeah yeah yeah yeah yeah",  # past four words: not a backchannel any more
    ],
)
def test_anything_more_interrupts(words: str) -> None:
    assert judged(words) is INTERRUPT


def test_the_words_are_awaited_while_the_voice_is_short() -> None:
    assert judged(None, voiced_ms=400, stopped=False) is None
    assert judged(None, voiced_ms=400, stopped=True) is None


def test_a_long_voice_interrupts_whatever_its_words() -> None:
    assert judged(None, voiced_ms=720, stopped=False) is INTERRUPT
    assert judged("yeah", voiced_ms=720) is INTERRUPT


def test_a_voice_shorter_than_min_speech_is_judged_by_its_words() -> None:
    """The words "Wait, stop." were heard as two pieces of 140 and 180 ms: words, not noise."""
    assert judged(None, voiced_ms=120, stopped=True) is None  # its words are awaited
    assert judged(None, voiced_ms=120, stopped=False) is None  # it may go on
    assert judged("", voiced_ms=120) is KEEP  # a click, a breath
    assert judged("Wait,", voiced_ms=140) is INTERRUPT
    assert judged("Wait, stop.", voiced_ms=180) is INTERRUPT


def test_a_voice_well_under_the_users_is_kept_whatever_it_says() -> None:
    judge = BackchannelRules()
    far = Overlap(2_000, False, "No, I meant Tuesday.", 200, against_user_db=-10.0)
    assert judge.judge(far) is Verdict.KEEP
    near = Overlap(2_000, False, "No, I meant Tuesday.", 200, against_user_db=-3.0)
    assert judge.judge(near) is Verdict.INTERRUPT
    unknown = Overlap(2_000, False, None, 200)  # before the user's first turn
    assert judge.judge(unknown) is Verdict.INTERRUPT


def test_the_users_level_is_learnt_from_their_turns() -> None:
    from loadtest.speech import speak, trim_silence
    from sessions.turn_detection import frame_level_dbfs
    from sessions.voice_level import VoiceLevels

    pcm = trim_silence(speak("What is the weather like in Paris today?"))
    levels = VoiceLevels()

    def hear(samples: np.ndarray) -> None:
        levels.speech_started()
        for at in range(0, len(samples) - 320, 320):
            levels.frame(frame_level_dbfs(samples[at : at + 320].tobytes()))

    hear(pcm)
    assert levels.against_user_db() is None  # no turn of the user's yet
    levels.speech_ended()
    levels.frame(frame_level_dbfs(np.zeros(320, np.int16).tobytes()))  # after: not kept
    levels.user_turn()
    hear((pcm.astype(np.float32) * 10 ** (-12 / 20)).astype(np.int16))
    assert levels.against_user_db() == pytest.approx(-12.0, abs=0.5)
    hear(pcm)
    assert levels.against_user_db() == pytest.approx(0.0, abs=0.5)
