"""The quality figure: answers' audio run back through speech recognition and compared with
what the answer should say.

With the echo pipeline an answer is the question's own audio, so the reference is the
question's text; the word error rate (loadtest.speech_set's normalisation) says whether the
audio survived the trip (codec, resampling, pacing, truncation) intact. Whisper base (the
Thinker's recogniser, from PyPI) by default, pocketsphinx for a quicker look.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from ..speech_set import word_errors
from ..voice_mic import RATE
from .clips import read_clips

MAX_CLIPS = 8


def _recogniser(name: str) -> Any:
    if name == "whisper":
        from pipeline.engines.cascade.whisper_asr import WhisperRecognizer

        return WhisperRecognizer(threads=1)
    from pipeline.engines.cascade.asr import SpeechRecognizer

    return SpeechRecognizer()


def quality(directories: list[Path], asr: str = "whisper") -> dict[str, Any]:
    """WER of up to `MAX_CLIPS` kept answers (from every step's directory)."""
    clips = [c for d in directories for c in read_clips(d)][:MAX_CLIPS]
    if not clips or asr == "none":
        return {"asr": asr, "clips": len(clips), "wer": None}
    recogniser = _recogniser(asr)
    errors = words = 0
    heard: list[dict[str, Any]] = []
    started = time.monotonic()
    for protocol, text, pcm in clips:
        pcm16k = np.asarray(soxr.resample(pcm, RATE, 16_000), dtype=np.int16)
        said = str(recogniser.transcribe(pcm16k))
        e, n = word_errors(text, said)
        errors, words = errors + e, words + n
        heard.append({"protocol": protocol, "reference": text, "heard": said, "errors": e})
    return {
        "asr": asr,
        "clips": len(clips),
        "wer": round(errors / words, 4) if words else None,
        "answer_audio_s": [round(len(pcm) / RATE, 2) for _, _, pcm in clips],
        "heard": heard,
        "asr_s": round(time.monotonic() - started, 2),
    }
