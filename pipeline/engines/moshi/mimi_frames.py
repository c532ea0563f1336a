"""Mimi, Moshi's codec, a frame (80 ms, 1,920 samples at 24 kHz) at a time for many sessions.

Each step encodes every session's newest microphone frame into 8 codes and decodes every
session's newest voice frame into audio. Mimi's convolutions look back over earlier frames;
here each session keeps its last `context` frames of microphone audio and of voice codes,
and each step runs the codec over those windows (all sessions in one batch) and keeps the
newest frame of the result. That costs `context` frames of codec work per frame, in
exchange for needing no per-session convolution state; the frame benchmark measures it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

FRAME_SAMPLES = 1920
RATE = 24_000


class MimiFrames:
    def __init__(self, codec: Any, *, codebooks: int, context: int = 4) -> None:
        parameter = next(codec.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.codec, self.codebooks, self.context = codec, codebooks, context
        self._heard: dict[str, torch.Tensor] = {}
        """Per session: its last `context` frames of microphone audio, [context * 1920]."""
        self._said: dict[str, torch.Tensor] = {}
        """Per session: its voice's last `context` frames of codes, [codebooks, context]."""

    def forget(self, session_id: str) -> None:
        self._heard.pop(session_id, None)
        self._said.pop(session_id, None)

    @torch.inference_mode()
    def encode(self, frames: Mapping[str, npt.NDArray[np.int16]]) -> dict[str, torch.Tensor]:
        """Each session's newest microphone frame (1,920 PCM16 samples) -> its [codebooks]."""
        if not frames:
            return {}
        ids = list(frames)
        windows = []
        for s in ids:
            pcm = torch.from_numpy(frames[s].astype(np.float32) / 32768.0)
            past = self._heard.get(s)
            if past is None:
                past = torch.zeros(self.context * FRAME_SAMPLES)
            window = torch.cat([past[FRAME_SAMPLES:], pcm])
            self._heard[s] = window
            windows.append(window)
        batch = torch.stack(windows)[:, None].to(self.device, self.dtype)
        codes = self.codec.encode(batch, num_quantizers=self.codebooks)[0]  # [n, K, frames]
        newest = codes[:, :, -1].cpu()
        return {s: newest[i] for i, s in enumerate(ids)}

    @torch.inference_mode()
    def decode(self, codes: Mapping[str, torch.Tensor]) -> dict[str, npt.NDArray[np.int16]]:
        """Each session's newest voice frame ([codebooks] codes) -> 1,920 PCM16 samples."""
        if not codes:
            return {}
        ids = list(codes)
        windows = []
        for s in ids:
            past = self._said.get(s)
            if past is None:
                past = torch.zeros(self.codebooks, self.context, dtype=torch.long)
            window = torch.cat([past[:, 1:], codes[s].to(torch.long)[:, None]], dim=1)
            self._said[s] = window
            windows.append(window)
        batch = torch.stack(windows).to(self.device)
        audio = self.codec.decode(batch).audio_values[:, 0, -FRAME_SAMPLES:].float().cpu()
        pcm = (audio.clamp(-1, 1) * 32767).round().to(torch.int16).numpy()
        return {s: pcm[i] for i, s in enumerate(ids)}
