"""Speech recognition for the Thinker: the recogniser interface, and pocketsphinx.

`make_recognizer` picks one by name: "whisper" (Whisper base, `whisper_asr.py`; the default,
about four times fewer word errors on the spoken set of `python -m loadtest.asr_wer`) or
"pocketsphinx", below.

A recogniser gives the words (`transcribe`), or the words and their tokens'
log-probabilities when the request asks (`recognise`, `RecognitionHints.logprobs`): Whisper
has them (transcript.py); pocketsphinx decodes words, not tokens, and has no per-token
log-probabilities to give: None, never made-up numbers.

pocketsphinx is small and fully offline (its acoustic model, language model and dictionary
ship in the wheel), runs at about a fifth of real time on one core, and is accurate on clean
speech. It is thrown off by perfectly clean synthetic audio (digital silence between words), so
a little noise, 30 LSB (about -60 dBFS, below any real microphone's floor), is added first:
that halves its error rate on espeak-ng speech and changes nothing on recorded speech.
"""

from __future__ import annotations

import threading
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from ...types import INPUT_SAMPLE_RATE, NO_HINTS, RecognitionHints
from .errors import ModelPackageMissing
from .transcript import Transcript

DEFAULT_DITHER = 30.0

RecognizerName = Literal["whisper", "whisper-tiny", "pocketsphinx"]
RECOGNIZERS: tuple[RecognizerName, ...] = ("whisper", "whisper-tiny", "pocketsphinx")
"""`whisper`: Whisper base; `whisper-tiny`: Whisper tiny.en, ~2-3x faster on one thread, as
accurate on Piper's voice and less on espeak's (`python -m loadtest.asr_wer`)."""
DEFAULT_RECOGNIZER: RecognizerName = "whisper"


class Recognizer(Protocol):
    """One utterance in, its words out; blocking and thread-safe, loaded once per process.
    `hints`: the client's language and prompt, for a recogniser that can use them."""

    def transcribe(
        self, pcm16: npt.NDArray[np.int16], hints: RecognitionHints = NO_HINTS
    ) -> str: ...

    def recognise(
        self, pcm16: npt.NDArray[np.int16], hints: RecognitionHints = NO_HINTS
    ) -> Transcript:
        """The words, and their tokens' log-probabilities if `hints.logprobs` asks and the
        recogniser has them (else None); unasked, no dearer than `transcribe`."""
        ...


def make_recognizer(name: str = DEFAULT_RECOGNIZER) -> Recognizer:
    """The recogniser called `name` (one of RECOGNIZERS); blocking: it loads a model."""
    if name in ("whisper", "whisper-tiny"):
        from .whisper_asr import BASE, TINY_EN, WhisperRecognizer

        return WhisperRecognizer(model=BASE if name == "whisper" else TINY_EN)
    if name == "pocketsphinx":
        return SpeechRecognizer()
    raise ValueError(f"unknown recognizer {name!r}: use one of {', '.join(RECOGNIZERS)}")


class SpeechRecognizer:
    """Transcribes one utterance at a time; `transcribe` blocks, so call it in a thread.

    A pocketsphinx decoder is not thread-safe, and loading one costs ~0.5 s, so a recognizer
    owns one decoder and serialises calls on a lock.
    """

    def __init__(self, *, dither: float = DEFAULT_DITHER) -> None:
        try:
            from pocketsphinx import Decoder
        except ImportError as exc:
            raise ModelPackageMissing("pocketsphinx", "pip install pocketsphinx") from exc
        self.dither = dither
        self._decoder: Any = Decoder(samprate=INPUT_SAMPLE_RATE, loglevel="FATAL")
        self._lock = threading.Lock()

    def transcribe(self, pcm16: npt.NDArray[np.int16], hints: RecognitionHints = NO_HINTS) -> str:
        """The words in `pcm16` (mono at INPUT_SAMPLE_RATE), lower case; "" if none.
        English only, with its own language model: `hints` are not used."""
        if len(pcm16) == 0:
            return ""
        audio = pcm16
        if self.dither > 0:
            noise = np.random.default_rng(len(pcm16)).normal(0.0, self.dither, len(pcm16))
            audio = np.clip(pcm16 + noise, -32768, 32767).astype(np.int16)
        with self._lock:
            self._decoder.start_utt()
            self._decoder.process_raw(audio.tobytes(), full_utt=True)
            self._decoder.end_utt()
            hyp = self._decoder.hyp()
        return str(hyp.hypstr).strip() if hyp is not None else ""

    def recognise(
        self, pcm16: npt.NDArray[np.int16], hints: RecognitionHints = NO_HINTS
    ) -> Transcript:
        """`transcribe`'s words; no token log-probabilities (pocketsphinx has none)."""
        return Transcript(self.transcribe(pcm16, hints))
