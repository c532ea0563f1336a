"""A transcript's tokens and their log-probabilities (OpenAI's `include:
["item.input_audio_transcription.logprobs"]`): Whisper's from its own decode, equal to
CTranslate2's score; none where a recogniser has none, and nothing dearer unasked."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from loadtest.speech import speak as espeak
from pipeline.engines.cascade.asr import SpeechRecognizer
from pipeline.engines.cascade.transcript import TokenBytes, token_logprobs
from pipeline.engines.cascade.whisper_asr import WhisperRecognizer
from pipeline.types import RecognitionHints
from tests.pipeline.cascade.conftest import Speak

LOGPROBS = RecognitionHints(logprobs=True)


class Decodes:
    """CTranslate2's Whisper, with every `generate` call's arguments and result kept."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.calls: list[tuple[dict[str, Any], Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        results = self._model.generate(*args, **kwargs)
        self.calls.append((kwargs, results[0]))
        return results


@pytest.fixture(scope="module")
def whisper() -> WhisperRecognizer:
    return WhisperRecognizer()


@pytest.fixture
def decodes(whisper: WhisperRecognizer, monkeypatch: pytest.MonkeyPatch) -> Decodes:
    spy = Decodes(whisper._model.model)
    monkeypatch.setattr(whisper._model, "model", spy)
    return spy


def log_softmax_at(row: Any, token: int) -> float:
    logits = np.asarray(row, dtype=np.float64).reshape(-1)
    peak = logits.max()
    return float(logits[token] - peak - np.log(np.exp(logits - peak).sum()))


@pytest.mark.parametrize(
    ("sentence", "language"),
    [
        ("how many days are in a week", ""),
        ("Bonjour, je voudrais une tasse de café s'il vous plaît.", "fr"),
    ],
)
def test_whispers_tokens_are_the_transcript_and_add_up_to_its_score(
    whisper: WhisperRecognizer, decodes: Decodes, speak: Speak, sentence: str, language: str
) -> None:
    pcm = espeak(sentence, voice="fr") if language else speak(sentence)
    heard = whisper.recognise(pcm, RecognitionHints(language=language, logprobs=True))
    assert heard.text and heard.logprobs
    print(f"\n{heard.text!r}: " + " ".join(f"{t.token!r} {t.logprob:.3f}" for t in heard.logprobs))
    assert "".join(t.token for t in heard.logprobs) == heard.text
    assert b"".join(t.utf8 for t in heard.logprobs).decode("utf-8") == heard.text
    assert all(t.logprob <= 0 and t.token.encode("utf-8") == t.utf8 for t in heard.logprobs)
    # CTranslate2's score is the tokens' log-probabilities and the end token's, over the
    # number of tokens (length_penalty 1): the end token's is its last step's.
    ((kwargs, result),) = decodes.calls
    assert kwargs["return_logits_vocab"] is True
    tokens = result.sequences_ids[0]
    assert len(tokens) == len(heard.logprobs) and len(result.logits[0]) == len(tokens) + 1
    end = log_softmax_at(result.logits[0][-1], whisper._tokenizer(language).eot)
    total = sum(t.logprob for t in heard.logprobs) + end
    assert math.isclose(total, result.scores[0] * len(tokens), abs_tol=1e-3)
    # ... and the words are those of the decode without them.
    assert whisper.recognise(pcm, RecognitionHints(language=language)).text == heard.text


def test_unasked_the_decode_is_the_same_call_and_gives_none(
    whisper: WhisperRecognizer, decodes: Decodes, speak: Speak
) -> None:
    heard = whisper.recognise(speak("play some relaxing music"))
    assert heard.text and heard.logprobs is None
    assert whisper.transcribe(speak("play some relaxing music"), LOGPROBS) == heard.text
    assert [kwargs["return_logits_vocab"] for kwargs, _ in decodes.calls] == [False, False]


def test_silence_has_no_tokens_and_pocketsphinx_none(whisper: WhisperRecognizer) -> None:
    assert whisper.recognise(np.zeros(16_000, dtype=np.int16), LOGPROBS).logprobs == ()
    assert whisper.recognise(np.zeros(800, dtype=np.int16), LOGPROBS).logprobs == ()
    heard = SpeechRecognizer().recognise(np.zeros(16_000, dtype=np.int16), LOGPROBS)
    assert heard.logprobs is None


def test_over_30_s_faster_whispers_loop_gives_none(
    whisper: WhisperRecognizer, speak: Speak
) -> None:
    """faster-whisper's segments carry no token log-probabilities: none, not made up."""
    said = speak("how many days are in a week")
    pcm = np.concatenate([said, np.zeros(31 * 16_000, dtype=np.int16)])
    heard = whisper.recognise(pcm, LOGPROBS)
    assert "week" in heard.text.lower() and heard.logprobs is None


class ByteLevel:
    """A byte-level BPE vocabulary of four tokens: " caf", "é" (C3 A9), its two halves."""

    VOCAB = ("Ġcaf", "Ã©", "Ã", "©")

    def id_to_token(self, token_id: int) -> str:
        return self.VOCAB[token_id]


def test_a_tokens_bytes_are_exact_when_it_holds_part_of_a_character() -> None:
    rows = np.log(np.array([[0.5, 0.25, 0.125, 0.125]] * 4, dtype=np.float32))
    got = token_logprobs(list(rows), [0, 2, 3], text_below=4, token_bytes=TokenBytes(ByteLevel()))
    assert [t.utf8 for t in got] == [b"caf", b"\xc3", b"\xa9"]  # the space before: trimmed
    assert [t.token for t in got] == ["caf", "\ufffd", "\ufffd"]
    assert b"".join(t.utf8 for t in got).decode("utf-8") == "café"
    assert [round(t.logprob, 5) for t in got] == [
        round(math.log(p), 5) for p in (0.5, 0.125, 0.125)
    ]
    whole = token_logprobs(list(rows), [0, 1, 4], text_below=4, token_bytes=TokenBytes(ByteLevel()))
    # the special token (4: not under text_below) is no word
    assert [(t.token, t.utf8) for t in whole] == [("caf", b"caf"), ("é", b"\xc3\xa9")]
    assert [t.logprob for t in whole] == pytest.approx([math.log(0.5), math.log(0.25)])
