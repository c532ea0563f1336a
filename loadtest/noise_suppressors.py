"""The input noise suppressors the benches compare, as one stream each: 20 ms frames of
16 kHz mono PCM16 in, as many out.

- `off`: the frames as they are;
- `webrtc-near`, `webrtc-far`: what a session runs for `near_field` / `far_field`
  (sessions/noise_reduction.py: WebRTC's suppressor at level 2 / 3);
- `webrtc`: the same as `webrtc-near` (the name `asr_wer --noise-reduction` documents);
- `webrtc-1` ... `webrtc-4`: WebRTC's suppressor at that level (how the mapping was chosen);
- `rnnoise`: RNNoise (Xiph's recurrent network, weights built into the library) from the
  `pyrnnoise` wheel, measured beside WebRTC's and not a dependency of the server
  (`pip install pyrnnoise==0.4.5` to run it). It works at 48 kHz on 10 ms frames, so each
  frame goes up to 48 kHz and back through soxr streams (a few ms of delay, kept: the
  output stays the input's length, its start padded with silence).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import numpy as np
import soxr

from pipeline.audio_format import INPUT_FRAME_BYTES, INPUT_SAMPLE_RATE
from sessions.noise_reduction import LEVELS, NoiseSuppressor


class Suppressor(Protocol):
    def frame(self, frame: bytes) -> bytes: ...

    def close(self) -> None: ...


class _Off:
    def frame(self, frame: bytes) -> bytes:
        return frame

    def close(self) -> None:
        pass


class RNNoiseStream:
    """RNNoise over 16 kHz frames: up to 48 kHz, 480-sample frames, back down."""

    RATE = 48_000
    FRAME = 480

    def __init__(self) -> None:
        from pyrnnoise import rnnoise

        self._lib: Any = rnnoise.lib
        self._state: Any = rnnoise.create()
        self._up = soxr.ResampleStream(INPUT_SAMPLE_RATE, self.RATE, 1, dtype="float32")
        self._down = soxr.ResampleStream(self.RATE, INPUT_SAMPLE_RATE, 1, dtype="float32")
        self._pending = np.zeros(0, np.float32)
        self._out = np.zeros(0, np.float32)
        self._pointer = ctypes.POINTER(ctypes.c_float)

    def frame(self, frame: bytes) -> bytes:
        samples = np.frombuffer(frame, np.int16).astype(np.float32)
        self._pending = np.concatenate([self._pending, self._up.resample_chunk(samples)])
        cleaned: list[np.ndarray] = []
        while len(self._pending) >= self.FRAME:
            block = np.ascontiguousarray(self._pending[: self.FRAME])
            self._pending = self._pending[self.FRAME :]
            ptr = block.ctypes.data_as(self._pointer)
            self._lib.rnnoise_process_frame(self._state, ptr, ptr)
            cleaned.append(block)
        if cleaned:
            down = self._down.resample_chunk(np.concatenate(cleaned))
            self._out = np.concatenate([self._out, down])
        wanted = len(samples)
        if len(self._out) < wanted:  # the resamplers' delay, at the start only
            self._out = np.concatenate([np.zeros(wanted - len(self._out), np.float32), self._out])
        out, self._out = self._out[:wanted], self._out[wanted:]
        return np.clip(out, -32768, 32767).astype(np.int16).tobytes()

    def close(self) -> None:
        if self._state is not None:
            from pyrnnoise import rnnoise

            rnnoise.destroy(self._state)
            self._state = None


SUPPRESSORS: dict[str, Callable[[], Suppressor]] = {
    "off": _Off,
    "webrtc": lambda: NoiseSuppressor(LEVELS["near_field"]),
    "webrtc-near": lambda: NoiseSuppressor(LEVELS["near_field"]),
    "webrtc-far": lambda: NoiseSuppressor(LEVELS["far_field"]),
    "rnnoise": RNNoiseStream,
}
for _level in range(1, 5):
    SUPPRESSORS[f"webrtc-{_level}"] = partial(NoiseSuppressor, _level)


def suppress(suppressor: Suppressor, pcm: np.ndarray) -> np.ndarray:
    """`pcm` (mono int16) through `suppressor` 20 ms at a time; a short tail is padded
    with silence for the suppressor and cut off again."""
    data = pcm.astype("<i2").tobytes()
    data += b"\0" * (-len(data) % INPUT_FRAME_BYTES)
    out = b"".join(
        suppressor.frame(data[i : i + INPUT_FRAME_BYTES])
        for i in range(0, len(data), INPUT_FRAME_BYTES)
    )
    return np.frombuffer(out, np.int16)[: len(pcm)].copy()
