"""The last-word rule of semantic_vad on what Whisper writes (loadtest.turn_end_bench found
these cases)."""

from __future__ import annotations

import pytest

from sessions.turn_end import sounds_finished


@pytest.mark.parametrize(
    ("words", "finished"),
    [
        ("What is the square root of 64?", True),  # a number is the last word, not "of"
        ("Set a timer for 10 minutes.", True),
        ("What is 2 plus?", False),
        ("Remind me every", False),
        ("Can I have some?", True),
        ("What is it made of?", False),  # a known miss of a rule on the last word
    ],
)
def test_the_last_word_decides(words: str, finished: bool) -> None:
    assert sounds_finished(words) is finished
