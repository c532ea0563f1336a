"""The end-of-turn benchmark on a few spoken questions, whole and broken after a function
word: what a user of semantic_vad would notice, with the real detector, Piper and Whisper.

The recognition's time is fixed (150 ms, about one Whisper run here) so the outcome does
not depend on how busy the machine is (the rule itself takes microseconds).
"""

from __future__ import annotations

import pytest

from loadtest.speech_set import SENTENCES, piper_speaker
from loadtest.turn_end_bench import MODES, Hearing, Judge, measure, simulate, verdict_of
from loadtest.turn_end_judges import rule_score
from loadtest.turn_end_set import PAUSES_MS, Turn, split, trimmed, turns

ASR_MS = 150


def test_a_sentence_breaks_after_its_word_and_a_part_is_trimmed_to_its_voice() -> None:
    assert split("How far is the moon from the earth?", "the#2") == (
        "How far is the moon from the",
        "earth?",
    )
    assert split("Set a timer for ten minutes.", "timer")[1] == "for ten minutes."
    with pytest.raises(ValueError, match="not in"):
        split("Why is the sky blue?", "moon")


@pytest.mark.slow  # real models (~6 s)
def test_semantic_medium_waits_out_hesitations_and_answers_whole_questions_sooner() -> None:
    set_ = turns(piper_speaker(), SENTENCES[:4], PAUSES_MS, kinds=("whole", "function"))
    assert len(set_) == 4 * (1 + len(PAUSES_MS))
    for turn in set_:
        assert len(trimmed(turn.audio[: turn.voice_end_ms * 16])) > 0
    hearing, judge = Hearing(), Judge("rule", rule_score)
    verdict = verdict_of(hearing, judge, 0.5, ASR_MS)

    def ends(mode: str) -> list[tuple[Turn, int | None]]:
        chosen = None if mode == "server_vad" else verdict
        return [(turn, simulate(turn, MODES[mode], chosen)) for turn in set_]

    server = measure("server_vad", "-", ends("server_vad"))
    medium = measure("semantic_medium", "rule", ends("semantic_medium"))
    # server_vad's 500 ms cuts every pause longer than that; semantic medium cuts none.
    assert server.cut_by_pause_pct == {400: 0.0, 700: 100.0, 1000: 100.0}
    assert medium.cut_function_pct == 0.0
    assert server.cut_whole_pct == medium.cut_whole_pct == 0.0
    # A whole question ends once its words are judged: a pause (160 ms) and the verdict.
    assert medium.delay_p95_ms < server.delay_p50_ms - 100
