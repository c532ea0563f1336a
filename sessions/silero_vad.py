"""Silero VAD v6 as a voice detector for `TurnDetector`, in place of webrtcvad.

Silero VAD (MIT) is a small recurrent network that gives a speech probability for each
32 ms window (512 samples at 16 kHz, with the 64 samples before it as context); it ships
inside faster-whisper (`faster_whisper/assets/silero_vad_v6.onnx`), already the cascade's
recogniser, and is read from there without importing faster-whisper. It hears in 32 ms
steps: a 20 ms frame takes the verdict of the latest whole window (up to 12 ms old).

`SileroVoice` is one stream's state (the network's memory, the samples not yet in a
window); the ONNX session is loaded once per process and shared. It costs ~70 us a 20 ms
frame here (webrtcvad: 2 us). On the end-of-turn bench's speech in low noise it ends turns
where webrtcvad with its level gate does (the gate, not the VAD, places the end), so it
buys no shorter silence window: at 300 ms every hesitation is cut off. Not the session's
detector; the bench and tests use it.
"""

from __future__ import annotations

import importlib.metadata
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

WINDOW = 512
CONTEXT = 64
SPEECH_ON = 0.5
"""A window is speech from this probability on (Silero's own default)..."""
SPEECH_OFF = 0.35
"""...and stays speech until it falls below this one (Silero's hysteresis)."""
_MODEL_FILE = "faster_whisper/assets/silero_vad_v6.onnx"

_session: Any = None
_loading = threading.Lock()


def _shared_session() -> Any:
    """The process's one ONNX session of the model, loaded on first use (blocking)."""
    global _session
    with _loading:
        if _session is None:
            import onnxruntime as ort

            located = importlib.metadata.distribution("faster-whisper").locate_file(_MODEL_FILE)
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            _session = ort.InferenceSession(
                str(Path(str(located))), sess_options=options, providers=["CPUExecutionProvider"]
            )
        return _session


class SileroVoice:
    """Is a 20 ms frame speech? Silero's verdict on the latest 32 ms window, with hysteresis."""

    def __init__(self) -> None:
        self._session = _shared_session()
        self._h = np.zeros((1, 1, 128), np.float32)
        self._c = np.zeros((1, 1, 128), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)
        self._speech = False

    def __call__(self, frame: bytes) -> bool:
        """Take one frame of 16 kHz PCM16; whether speech is heard as of its end."""
        samples = np.frombuffer(frame, "<i2").astype(np.float32) / 32768.0
        self._pending = np.concatenate([self._pending, samples])
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            self._judge(window)
        return self._speech

    def _judge(self, window: npt.NDArray[np.float32]) -> None:
        batch = np.concatenate([self._context, window])[None]
        out, self._h, self._c = self._session.run(
            None, {"input": batch, "h": self._h, "c": self._c}
        )
        self._context = window[-CONTEXT:]
        p = float(np.asarray(out).reshape(-1)[0])
        self._speech = p >= (SPEECH_OFF if self._speech else SPEECH_ON)


def speech_ms(pcm: npt.NDArray[np.int16]) -> int:
    """How much of `pcm` (16 kHz PCM16) Silero hears as speech: its speech windows, in ms.
    A stream of its own (fresh state); blocking (~2 ms a second of audio): call it off the
    event loop. Adaptive barge-in asks it before recognising speech over an answer
    (overlap.py): a cough, a clatter or a hiss that the level-gated webrtcvad took for a
    voice is one Silero hears little speech in, and Whisper may still write words for."""
    voice = SileroVoice()
    windows = 0
    for at in range(0, len(pcm) - WINDOW + 1, WINDOW):
        windows += voice(pcm[at : at + WINDOW].tobytes())
    return windows * WINDOW * 1000 // 16_000
