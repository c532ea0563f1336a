"""Pipecat's Smart Turn v3.2: does the user's voice sound finished? semantic_vad from the audio.

Smart Turn is a small Whisper-encoder classifier (BSD-2, Daily) trained on where speakers
end their turns, from the sound alone: intonation, a trailing "and", the drawn-out last
syllable of a thought not yet finished. It ships as an 8 MB ONNX file inside the
`pipecat-ai` wheel, which is read from there (`pipecat` itself is never imported); where that
package is not installed the model is absent and the caller judges by the words instead.

Its input contract: the last 8 s of the turn at 16 kHz (less is padded with zeros in
front), normalised to zero mean and unit variance over the whole 8 s, as Whisper's 80 log-mel
bands (25 ms windows every 10 ms, floored 8 decades below the loudest, scaled to about
[-1, 1]): an array of 80 x 800 (the same as Pipecat's own features, to the bit). It answers
one probability that the turn is complete. The input is fixed in size, so every judgement
costs the same: ~100-140 ms on one core of this 2-core machine (`loadtest.turn_end_bench`);
the model runs on one ONNX thread, one judgement at a time. The audio should run on past the
voice into the pause (the session's 160 ms): without that trailing silence, whole questions
score far lower.

Not semantic_vad's judge (yet): on the bench's Piper-spoken questions it cut off more
hesitations after a function word than the cascade's SmolLM2 judge and kept whole
questions waiting longer at p95 (README, "end of turn, offline"). The bench uses it.
"""

from __future__ import annotations

import importlib.metadata
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.audio_format import INPUT_SAMPLE_RATE

WINDOW_S = 8
"""The model hears the last 8 s of a turn."""
N_FFT = 400
HOP = 160
N_MELS = 80
THRESHOLD = 0.5
"""P(complete) at and over which the audio sounds finished: the model's own cut. The bench
chooses its own per fold by balanced accuracy (0.88 and 0.98 on its Piper questions)."""
_MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"


def model_path() -> Path | None:
    """The ONNX file in the installed pipecat-ai wheel, or None where it is not installed."""
    try:
        located = importlib.metadata.distribution("pipecat-ai").locate_file(_MODEL_FILE)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(located))
    return path if path.is_file() else None


def _mel_filters() -> npt.NDArray[np.float64]:
    """Slaney-scale triangular mel filters, area-normalised (Whisper's): (N_MELS, bins)."""

    def to_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        linear = hz * 3.0 / 200.0
        logs = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * 27.0 / np.log(6.4)
        return np.where(hz >= 1000.0, logs, linear)

    def to_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        linear = mel * 200.0 / 3.0
        logs = 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0)
        return np.where(mel >= 15.0, logs, linear)

    edges_mel = np.linspace(0.0, to_mel(np.array([INPUT_SAMPLE_RATE / 2.0]))[0], N_MELS + 2)
    edges = to_hz(edges_mel)
    bins = np.linspace(0.0, INPUT_SAMPLE_RATE / 2.0, N_FFT // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    result: npt.NDArray[np.float64] = filters
    return result


_FILTERS = _mel_filters()
_WINDOW = np.hanning(N_FFT + 1)[:-1]
"""A periodic Hann window."""


def features(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.float32]:
    """The model's input for a turn's audio (16 kHz PCM16): 80 x 800 log-mel bands of its
    last 8 s."""
    n = WINDOW_S * INPUT_SAMPLE_RATE
    audio = pcm[-n:].astype(np.float32) / 32768.0
    audio = np.concatenate([np.zeros(n - len(audio), np.float32), audio])
    audio = (audio - audio.mean()) / np.sqrt(audio.var() + 1e-7)
    padded = np.pad(audio.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    power = np.abs(np.fft.rfft(frames * _WINDOW, axis=-1)) ** 2
    log_mel = np.log10(np.maximum(_FILTERS @ power.T, 1e-10))[:, :-1]
    log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
    scaled: npt.NDArray[np.float32] = ((log_mel + 4.0) / 4.0).astype(np.float32)
    return scaled


class SmartTurn:
    """The loaded model: `probability(pcm)`, blocking (run it off the event loop)."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session: Any = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._lock = threading.Lock()
        """One judgement at a time: the cost stays one core's, however many sessions ask."""

    def probability(self, pcm: npt.NDArray[np.int16]) -> float:
        """P(the turn is complete) for a turn's audio so far (its last 8 s count)."""
        batch = features(pcm)[None]
        with self._lock:
            (logits,) = self._session.run(None, {"input_features": batch})
        return float(np.asarray(logits).reshape(-1)[0])


_loaded: SmartTurn | None = None
_loading = threading.Lock()


def shared() -> SmartTurn | None:
    """The process's one SmartTurn, loaded on first use (blocking, ~0.2 s); None where the
    model is not installed."""
    global _loaded
    with _loading:
        if _loaded is None:
            path = model_path()
            if path is None:
                return None
            _loaded = SmartTurn(path)
        return _loaded
