"""Mimi, Moshi's codec, a frame (80 ms, 1,920 samples at 24 kHz) at a time for many sessions.

Each step encodes every session's newest microphone frame into 8 codes and decodes every
session's newest voice frame into audio. Mimi's convolutions look back over earlier frames;
here each session keeps its last `context` frames of microphone audio and of voice codes,
and each step runs the codec over those windows (all sessions in one batch) and keeps the
newest frame of the result. That costs `context` frames of codec work per frame, in
exchange for needing no per-session convolution state; the frame benchmark measures it.

On a GPU both directions are captured as CUDA graphs per batch bucket (StepGraphs, as the
frame step is), reading static buffers: the codec's kernels are small and many, so eagerly
its time was launches (16 ms to encode one session's frame on an H200 beside a busy event
loop, against 9.5 ms alone). `warm` captures every bucket before the first session, so no
join meets a new batch size (its kernels chosen and loaded: a late frame each). A bucket
larger than the sessions computes spare rows nothing reads. Mimi's convolutions keep their
stride and kernel size as buffers, which moved to the GPU with the model, and compute their
padding from them: a read back to the host, which no capture allows. They are shape
arithmetic only, so they go back to the CPU (`_shapes_on_host`). A capture that fails all
the same (another transformers version) leaves CUDA's random state unusable, so it stops
the engine's start with the reason rather than running on. On a CPU each batch simply
runs at its own size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..qwen3_omni.step_graphs import StepGraphs

FRAME_SAMPLES = 1920
RATE = 24_000


class MimiFrames:
    def __init__(
        self,
        codec: Any,
        *,
        codebooks: int,
        context: int = 4,
        largest: int | None = None,
        bucketed: bool | None = None,
    ) -> None:
        parameter = next(codec.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.codec, self.codebooks, self.context = codec, codebooks, context
        self._heard: dict[str, torch.Tensor] = {}
        """Per session: its last `context` frames of microphone audio, [context * 1920]."""
        self._said: dict[str, torch.Tensor] = {}
        """Per session: its voice's last `context` frames of codes, [codebooks, context]."""
        if bucketed is None:
            bucketed = largest is not None and self.device.type == "cuda"
        rows = (largest or 1) if bucketed else 0
        shape = (rows, 1, context * FRAME_SAMPLES)
        self._audio = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._codes = torch.zeros(rows, codebooks, context, dtype=torch.long, device=self.device)
        """The bucketed steps' inputs (none unbucketed): each step's windows are copied into
        the first rows."""
        self._encoder: StepGraphs[torch.Tensor] | None = None
        self._decoder: StepGraphs[torch.Tensor] | None = None
        """Bucketed steps over the static buffers: captured on a GPU; on a CPU (a test of
        this path, `bucketed=True`) the same steps run plainly."""
        if bucketed:
            _shapes_on_host(codec)
            self._encoder = StepGraphs(self._encode_rows, largest=rows, device=self.device)
            self._decoder = StepGraphs(self._decode_rows, largest=rows, device=self.device)

    @property
    def captured(self) -> bool:
        """Whether the codec replays CUDA graphs (False on a CPU, or where capture failed)."""
        return any(g is not None and g.capture for g in (self._encoder, self._decoder))

    def warm(self) -> None:
        """Capture (on a CPU: run once) every bucket both ways."""
        for name, graphs in (("encode", self._encoder), ("decode", self._decoder)):
            if graphs is None:
                continue
            try:
                graphs.warm()
            except RuntimeError as exc:  # the codec does something no capture allows
                raise RuntimeError(
                    f"Mimi's {name} could not be captured as a CUDA graph ({exc}); this "
                    "transformers version's codec reads a value back to the host"
                ) from exc
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def forget(self, session_id: str) -> None:
        self._heard.pop(session_id, None)
        self._said.pop(session_id, None)

    def _encode_rows(self, size: int) -> torch.Tensor:
        """The captured encode: the first `size` rows of the static audio windows."""
        return self._encode_at(self._audio[:size])

    def _decode_rows(self, size: int) -> torch.Tensor:
        """The captured decode: the first `size` rows of the static code windows."""
        return self._decode_at(self._codes[:size])

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
        batch = torch.stack(windows)[:, None]
        if self._encoder is None:
            newest = self._encode_at(batch.to(self.device, self.dtype))
        else:
            self._audio[: len(ids)].copy_(batch.to(self.dtype), non_blocking=True)
            newest = self._encoder.run(len(ids))[: len(ids)]
        codes = newest.cpu()
        return {s: codes[i] for i, s in enumerate(ids)}

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
        batch = torch.stack(windows)
        if self._decoder is None:
            audio = self._decode_at(batch.to(self.device))
        else:
            self._codes[: len(ids)].copy_(batch, non_blocking=True)
            audio = self._decoder.run(len(ids))[: len(ids)]
        pcm = audio.cpu().numpy()
        return {s: pcm[i] for i, s in enumerate(ids)}

    def _encode_at(self, audio: torch.Tensor) -> torch.Tensor:
        """[n, 1, context * 1920] windows -> the newest frame's codes, [n, codebooks]."""
        codes: torch.Tensor = self.codec.encode(audio, num_quantizers=self.codebooks)[0]
        return codes[:, :, -1]

    def _decode_at(self, codes: torch.Tensor) -> torch.Tensor:
        """[n, codebooks, context] code windows -> the newest frame as PCM16, [n, 1920]."""
        audio: torch.Tensor = self.codec.decode(codes).audio_values[:, 0, -FRAME_SAMPLES:]
        return (audio.float().clamp(-1, 1) * 32767).round().to(torch.int16)


def _shapes_on_host(codec: Any) -> None:
    """Each convolution's stride, kernel size and padding back on the CPU (see above)."""
    for module in codec.modules():
        for name in ("stride", "kernel_size", "padding_total"):
            value = module._buffers.get(name)
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                module._buffers[name] = value.cpu()
