"""Whisper base, the Thinker's default recogniser, hears the fixed spoken set (issue 12).

The whole Piper set (30 questions) is the threshold test: under 10 % word error rate (it
measured 1.5 %; pocketsphinx 12 %). The others check what the Thinker relies on: silence is no
words, calls from two threads do not mix, and the Thinker's `recognizer` argument picks it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from loadtest.speech import speak as espeak
from loadtest.speech_set import SENTENCES, spoken_set, word_errors
from pipeline.engines.cascade.asr import SpeechRecognizer, make_recognizer
from pipeline.engines.cascade.thinker import ThinkerEngine
from pipeline.engines.cascade.whisper_asr import WhisperRecognizer
from pipeline.types import RecognitionHints
from tests.pipeline.cascade.conftest import Speak

MAX_WER = 0.10


@pytest.fixture(scope="module")
def whisper() -> WhisperRecognizer:
    return WhisperRecognizer()


@pytest.mark.slow
def test_hears_the_piper_set_with_few_word_errors(whisper: WhisperRecognizer) -> None:
    errors = words = 0
    took: list[float] = []
    for utterance in spoken_set("piper"):
        started = time.perf_counter()
        heard = whisper.transcribe(utterance.audio)
        took.append(time.perf_counter() - started)
        wrong, count = word_errors(utterance.reference, heard)
        errors, words = errors + wrong, words + count
    p95 = float(np.percentile(took, 95))
    print(f"\nWER {errors / words:.1%} over {len(took)} sentences, p95 {p95 * 1000:.0f} ms")
    assert len(took) == len(SENTENCES)
    assert errors / words < MAX_WER


def test_hears_a_question_in_well_under_a_second(whisper: WhisperRecognizer, speak: Speak) -> None:
    audio = speak("how many days are in a week")
    started = time.perf_counter()
    heard = whisper.transcribe(audio)
    took = time.perf_counter() - started
    print(f"\nheard {heard!r} in {took * 1000:.0f} ms for {len(audio) / 16_000:.2f} s of audio")
    assert word_errors("how many days are in a week", heard)[0] <= 1, heard
    assert took < 1.0


def test_silence_is_no_words(whisper: WhisperRecognizer) -> None:
    assert whisper.transcribe(np.zeros(0, dtype=np.int16)) == ""
    assert whisper.transcribe(np.zeros(800, dtype=np.int16)) == ""  # 50 ms: too short
    assert whisper.transcribe(np.zeros(16_000, dtype=np.int16)) == ""


def test_two_threads_get_their_own_words(whisper: WhisperRecognizer, speak: Speak) -> None:
    sentences = ["what is the capital of france", "play some relaxing music"]
    audio = [speak(s) for s in sentences]
    heard: dict[int, str] = {}

    def run(index: int) -> None:
        heard[index] = whisper.transcribe(audio[index])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, sentence in enumerate(sentences):
        assert word_errors(sentence, heard[index])[0] <= 1, heard[index]


def test_recognizers_are_chosen_by_name() -> None:
    assert isinstance(make_recognizer("whisper"), WhisperRecognizer)
    assert isinstance(make_recognizer("pocketsphinx"), SpeechRecognizer)
    with pytest.raises(ValueError, match="unknown recognizer"):
        make_recognizer("kaldi")


def test_the_thinker_takes_a_recognizer_argument() -> None:
    assert ThinkerEngine().recognizer == "whisper"
    assert ThinkerEngine(recognizer="pocketsphinx").recognizer == "pocketsphinx"
    with pytest.raises(ValueError, match="recognizer"):
        ThinkerEngine(recognizer="kaldi")


def test_tiny_en_is_a_recognizer_the_thinker_can_name(speak: Speak) -> None:
    """`recognizer: whisper-tiny`: Whisper tiny.en from its package, English only (no
    language or task tokens), hears a question and silence as base does."""
    tiny = make_recognizer("whisper-tiny")
    assert isinstance(tiny, WhisperRecognizer) and tiny.model == "tiny.en"
    heard = tiny.transcribe(speak("how many days are in a week"))
    assert word_errors("how many days are in a week", heard)[0] <= 1, heard
    assert tiny.transcribe(np.zeros(16_000, dtype=np.int16)) == ""
    with pytest.raises(ValueError, match="recognizer must be one of"):
        ThinkerEngine(recognizer="whisper-small")


def test_a_prompt_spells_the_names_it_names(whisper: WhisperRecognizer) -> None:
    """OpenAI's `transcription.prompt`: words to expect. Unprompted, Whisper base writes
    these names as it hears them; prompted, as the client spells them."""
    pcm = espeak("My name is Siobhan Quinlivan and I work at Zyxtrel.")
    assert "Quinlivan" not in whisper.transcribe(pcm)
    heard = whisper.transcribe(pcm, RecognitionHints(prompt="Siobhan Quinlivan, Zyxtrel"))
    assert "Siobhan Quinlivan" in heard and "Zyxtrel" in heard


def test_a_language_is_transcribed_in_it_not_translated(whisper: WhisperRecognizer) -> None:
    """Whisper base is multilingual: told the language, it writes French speech in French
    (the Thinker's default, English, translates it)."""
    pcm = espeak("Bonjour, je voudrais une tasse de café s'il vous plaît.", voice="fr")
    assert "coffee" in whisper.transcribe(pcm).lower()
    heard = whisper.transcribe(pcm, RecognitionHints(language="fr")).lower()
    assert "bonjour" in heard and "café" in heard
    with pytest.raises(ValueError, match="xx"):
        whisper.transcribe(pcm, RecognitionHints(language="xx"))
