"""The voice benchmark runs end to end and measures in order: short questions over the
real WebSocket to `parley serve --pipeline echo` (no model time, so the figures are the
transport's and turn detection's), plus its scoring on fixed strings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadtest.questions import QUESTIONS, Question, hits, normalise, word_error_rate
from loadtest.voice_bench import parley_server, run
from loadtest.voice_figures import STEPS, Turn, figures, table


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with parley_server("echo") as url:
        yield url


def test_scoring_normalises_words_and_counts_edits() -> None:
    assert normalise("What's twenty-four, Paris?") == "what's twenty four paris"
    assert hits("It is Mount Everest.", {"everest"})
    assert hits("Twenty-four hours.", {"twenty four", "24"})
    assert not hits("Parisian food", {"paris"})
    pairs = [("What is the capital of France?", "what is the capital of france")]
    assert word_error_rate(pairs) == 0.0
    # one deletion ("many"), one substitution, one insertion over 6 + 4 reference words
    pairs += [("How many legs, spider?", "how licks spider the")]
    assert word_error_rate(pairs) == pytest.approx(3 / 10)
    assert len(QUESTIONS) == 20
    assert all(q.keywords and normalise(k) == k for q in QUESTIONS for k in q.keywords)


def _short(*starts: str) -> list[Question]:
    return [q for q in QUESTIONS if q.text.startswith(starts)]


def _check_timed_in_order(turn: Turn) -> None:
    times = [turn.last_voiced, *(turn.at(step) for step in STEPS)]
    assert None not in times, turn
    assert times == sorted(times), turn  # type: ignore[type-var]
    # server VAD's 500 ms silence window, and no model time behind the echo
    stopped = turn.interval_ms("last_voiced", "speech_stopped")
    assert stopped is not None and 450 <= stopped <= 900, turn
    first_audio = turn.interval_ms("speech_stopped", "first_audio")
    assert first_audio is not None and first_audio < 300, turn
    assert turn.early_stops == 0
    assert turn.answers and turn.answers[0].startswith("(echo of")
    assert 1.0 < turn.audio_s < 5.0  # the question played back
    assert turn.mic_lag_s < 0.2


async def test_a_spoken_question_in_a_fresh_session_is_timed_in_order(echo_url: str) -> None:
    questions = _short("What is the opposite")
    turns = await run(echo_url, questions, fresh=True, vad="server", eagerness=None, warm=False)
    assert [t.question for t in turns] == questions
    _check_timed_in_order(turns[0])
    results = figures(turns)
    assert results["last_voiced->first_audio"]["n"] == 1
    assert results["keyword_hit_rate"] == 0.0  # an echo answers nothing
    assert "last_voiced -> first_audio" in table("echo", results)


@pytest.mark.slow
async def test_questions_one_after_another_in_one_session_are_each_timed(echo_url: str) -> None:
    """Each turn waits out the answer before the next: no event of one lands in the next."""
    questions = _short("What is the opposite", "What do we")
    turns = await run(echo_url, questions, fresh=False, vad="server", eagerness=None, warm=False)
    assert [t.question for t in turns] == questions
    for turn in turns:
        _check_timed_in_order(turn)
        assert len(turn.answers) == 1
    assert turns[1].last_voiced > turns[0].first_audio + turns[0].audio_s  # type: ignore[operator]
