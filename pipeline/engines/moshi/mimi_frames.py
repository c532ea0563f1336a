"""Mimi, Moshi's codec, a frame (80 ms, 1,920 samples at 24 kHz) at a time for many sessions.

Each step encodes every session's newest microphone frame into 8 codes and decodes every
session's newest voice frame into audio, each direction streamed with its state
(mimi_stream.py): a session's codes and audio are those of Mimi over its whole stream so
far, at one frame's work per frame. (Until issue 41 each frame re-ran the codec over the
last 4 frames from a zero state: a different function, at 4 frames' work a frame.)

Each direction keeps its sessions in its lowest rows (`SessionRows`): a session takes a row
(its state reset: a stream from silence) at its first frame in that direction, and on
`forget` the last row's session moves into the row it leaves, so a step over `n` sessions
is a step over rows 0..n-1. The decoder's rows are its own: a session's first voice frame
comes a frame after its first microphone frame (Moshi's acoustic delay).

On a GPU both directions are captured as CUDA graphs per batch bucket (StepGraphs, as the
frame step is) over the static buffers of their inputs and state: the codec's kernels are
small and many, so eagerly its time was launches (16 ms to encode one session's frame on an
H200 beside a busy event loop, against 9.5 ms alone). `warm` captures every bucket before
the first session, so no join meets a new batch size. A bucket larger than the sessions
computes spare rows whose results nothing reads and whose state nothing commits. A capture
that fails all the same (another transformers version) leaves CUDA's random state
unusable, so it stops the engine's start with the reason rather than running on. On a CPU
each batch simply runs at its own size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..qwen3_omni.step_graphs import StepGraphs
from .mimi_stream import FRAME_SAMPLES, StreamedDecoder, StreamedEncoder
from .session_rows import SessionRows

RATE = 24_000

__all__ = ["FRAME_SAMPLES", "RATE", "MimiFrames"]


class MimiFrames:
    def __init__(
        self, codec: Any, *, codebooks: int, rows: int, bucketed: bool | None = None
    ) -> None:
        parameter = next(codec.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.codebooks, self.rows = codebooks, rows
        self.encoder = StreamedEncoder(codec, rows=rows, codebooks=codebooks)
        self.decoder = StreamedDecoder(codec, rows=rows, codebooks=codebooks)
        self._heard = SessionRows(rows, reset=self.encoder.reset, move=self.encoder.move)
        self._said = SessionRows(rows, reset=self.decoder.reset, move=self.decoder.move)
        if bucketed is None:
            bucketed = self.device.type == "cuda"
        self._encoder: StepGraphs[torch.Tensor] | None = None
        self._decoder: StepGraphs[torch.Tensor] | None = None
        """Bucketed steps over the static buffers: captured on a GPU; on a CPU (a test of
        this path, `bucketed=True`) the same steps run plainly at the bucket's size."""
        if bucketed:
            self._encoder = StepGraphs(self.encoder.step, largest=rows, device=self.device)
            self._decoder = StepGraphs(self._decode_pcm, largest=rows, device=self.device)

    @property
    def captured(self) -> bool:
        """Whether the codec replays CUDA graphs (False on a CPU, or where capture failed)."""
        return any(g is not None and g.capture for g in (self._encoder, self._decoder))

    def warm(self) -> None:
        """Capture (on a CPU: run once) every bucket both ways, before any session: the
        capture's runs write spare state that a session's join resets."""
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
        """The session has left: its rows go to others (idempotent)."""
        with torch.inference_mode():
            self._heard.leave(session_id)
            self._said.leave(session_id)

    @torch.inference_mode()
    def encode(self, frames: Mapping[str, npt.NDArray[np.int16]]) -> dict[str, torch.Tensor]:
        """Each session's next microphone frame (1,920 PCM16 samples) -> its [codebooks]."""
        if not frames:
            return {}
        ids = self._heard.order(frames)
        n = len(ids)
        pcm = np.stack([frames[s] for s in ids]).astype(np.float32) / 32768.0
        self.encoder.audio[:n, 0].copy_(torch.from_numpy(pcm), non_blocking=True)
        step = self.encoder.step if self._encoder is None else self._encoder.run
        codes = step(n)[:n].cpu()
        self.encoder.commit(n)
        return {s: codes[i] for i, s in enumerate(ids)}

    @torch.inference_mode()
    def decode(self, codes: Mapping[str, torch.Tensor]) -> dict[str, npt.NDArray[np.int16]]:
        """Each session's next voice frame ([codebooks] codes) -> 1,920 PCM16 samples."""
        if not codes:
            return {}
        ids = self._said.order(codes)
        n = len(ids)
        batch = torch.stack([codes[s].to(torch.long) for s in ids])[:, :, None]
        self.decoder.codes[:n].copy_(batch, non_blocking=True)
        step = self._decode_pcm if self._decoder is None else self._decoder.run
        pcm = step(n)[:n].cpu().numpy()
        self.decoder.commit(n)
        return {s: pcm[i] for i, s in enumerate(ids)}

    def _decode_pcm(self, size: int) -> torch.Tensor:
        """The decode step as PCM16, [size, 1920]."""
        audio = self.decoder.step(size)
        return (audio.float().clamp(-1, 1) * 32767).round().to(torch.int16)
