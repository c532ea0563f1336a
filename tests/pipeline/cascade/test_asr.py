"""pocketsphinx recognises a sentence spoken by the Piper joe voice."""

from __future__ import annotations

import time

import numpy as np

from pipeline.engines.cascade.asr import SpeechRecognizer
from tests.pipeline.cascade.conftest import Speak


def test_transcribes_piper_speech_with_most_words_right(speak: Speak) -> None:
    recognizer = SpeechRecognizer()
    sentence = "please tell me a short story about a cat"
    audio = speak(sentence)
    started = time.perf_counter()
    heard = recognizer.transcribe(audio)
    took = time.perf_counter() - started
    print(f"\nheard {heard!r} in {took:.2f} s for {len(audio) / 16_000:.2f} s of audio")
    words = sentence.split()
    right = sum(word in heard.split() for word in words)
    assert right >= 0.7 * len(words), heard


def test_no_audio_is_no_words() -> None:
    assert SpeechRecognizer().transcribe(np.zeros(0, dtype=np.int16)) == ""
