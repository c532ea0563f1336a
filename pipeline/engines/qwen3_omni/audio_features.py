"""Turn audio (16 kHz PCM16) to the audio tower's input: Whisper-style log-mel features.

Qwen3-Omni's processor uses transformers' `WhisperFeatureExtractor` with 128 mel bins, no
padding to 30 s (the features are as long as the audio: 100 frames a second) and a feature
mask. The extractor is plain numpy and needs no files, so it is built here from those
settings; a checkpoint directory with a `preprocessor_config.json` supplies its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from transformers import WhisperFeatureExtractor

SAMPLE_RATE = 16_000


def audio_token_count(feature_frames: int) -> int:
    """How many audio tokens the audio tower makes of `feature_frames` mel frames.

    The tower works in windows of 100 frames (13 tokens each) plus a remainder downsampled
    by three stride-2 convolutions: the processor's and the tower's own arithmetic."""
    rest = feature_frames % 100
    after_first = (rest - 1) // 2 + 1
    rest_out = ((after_first - 1) // 2 + 1 - 1) // 2 + 1
    return int(rest_out + (feature_frames // 100) * 13)


@dataclass(frozen=True, slots=True)
class AudioInput:
    features: torch.Tensor
    """[1, mel_bins, frames] float32"""
    mask: torch.Tensor
    """[1, frames] int64 (all ones: one turn, nothing padded)"""
    tokens: int
    """audio placeholder tokens the prompt needs"""


class AudioFeatures:
    def __init__(self, mel_bins: int = 128, model_path: str | None = None) -> None:
        if model_path and (Path(model_path) / "preprocessor_config.json").is_file():
            self._extractor = WhisperFeatureExtractor.from_pretrained(model_path)
        else:
            self._extractor = WhisperFeatureExtractor(  # type: ignore[no-untyped-call]
                feature_size=mel_bins, sampling_rate=SAMPLE_RATE, hop_length=160, n_fft=400
            )

    def final_frames(self, samples: int) -> int:
        """How many of the mel frames of a turn's first `samples` samples no later sample
        changes: those whose STFT window lies within them (the last ones are padded by
        reflection until the audio after them comes). Each frame's value is also clamped
        to 80 dB below the turn's loudest; a louder frame later changes the clamped ones,
        which a streamed turn checks at its end (`streamed_turns.py`)."""
        hop, n_fft = int(self._extractor.hop_length), int(self._extractor.n_fft)
        if samples < n_fft:
            return 0
        return min(samples // hop, (samples - n_fft // 2) // hop + 1)

    def __call__(self, pcm: npt.NDArray[np.int16]) -> AudioInput | None:
        """None for no audio (a typed turn)."""
        if len(pcm) < self._extractor.n_fft:
            return None
        audio = pcm.astype(np.float32) / 32768.0
        out = self._extractor(
            audio,
            sampling_rate=SAMPLE_RATE,
            padding="longest",
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
        )
        features = out["input_features"].float()
        mask = out["attention_mask"].long()
        return AudioInput(features, mask, audio_token_count(int(mask.sum())))
