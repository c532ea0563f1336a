"""The Thinker's model judging whether the user's message ends here (turn_end_model.py),
with SmolLM2-135M-Instruct as it ships."""

from __future__ import annotations

import threading

import pytest
import torch

from pipeline.engines.cascade.smollm import load_language_model
from pipeline.engines.cascade.turn_end_model import TurnEndModel, normalised

pytestmark = pytest.mark.slow  # a real model (~3 s to load and judge)


@pytest.fixture(scope="module")
def model() -> TurnEndModel:
    torch.set_num_threads(1)
    return TurnEndModel(load_language_model())


def test_whole_questions_sound_finished_and_fragments_do_not(model: TurnEndModel) -> None:
    assert model.sounds_finished("What is the capital of France?") is True
    assert model.sounds_finished("How far is the moon from the earth?") is True
    # Whisper's punctuation after a fragment does not make it whole
    assert model.sounds_finished("What is the capital of?") is False
    assert model.sounds_finished("Can you recommend?") is False
    assert model.sounds_finished(" ?! ") is None


def test_the_cached_prompt_start_gives_the_whole_prompts_probability(
    model: TurnEndModel,
) -> None:
    from loadtest.turn_end_judges import lm_scorer

    whole_prompt = lm_scorer(normalised)
    for words in ("Set a timer.", "How many days are in A?"):
        cached, full = model.probability(words), whole_prompt(words)
        assert cached is not None and full is not None
        assert cached == pytest.approx(full, rel=1e-3)
    assert model.probability("Set a timer.") == model.probability("set a timer")  # cropped back


def test_the_judge_tokenizes_beside_the_thinkers_prompt_building(model: TurnEndModel) -> None:
    """The judge runs in a thread while the Thinker tokenizes the prompt of the answer begun
    on the same words: with one shared Rust tokenizer that failed ("Already borrowed")."""
    shared = model._lm.tokenizer  # noqa: SLF001 - the Thinker's
    failures: list[BaseException] = []

    def tokenize_prompts() -> None:
        try:
            for _ in range(300):  # a batch's prompts, padded as the generator pads them
                shared(["What is the capital of France? " * 8, "Hello."], padding=True)
        except BaseException as exc:  # noqa: BLE001 - what the Thinker would have met
            failures.append(exc)

    beside = threading.Thread(target=tokenize_prompts)
    beside.start()
    for _ in range(3):
        assert model.probability("what is the capital of france") is not None
    beside.join()
    assert not failures, failures
