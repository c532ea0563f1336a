"""Code2Wav in streaming chunks: codec frames in, 24 kHz audio out, with left context.

Code2Wav is causal but not stateless (a transformer with a sliding window, then transposed
convolutions), so a chunk decoded alone would click at its start. As vLLM-Omni does, each
chunk is decoded with up to `left_context` frames before it and the context's samples are
cut off. The first chunk is small (`first_chunk` frames) so that the first sound comes out
early; each later one is at most twice the one before, up to `chunk` frames. A chunk has to
be made while the one before it plays: at a real-time factor r, n frames take n x r x 80 ms
to make and the previous chunk's m frames play for m x 80 ms, so playback runs without a gap
while n <= m / r. Going straight from 5 frames to 25 left a gap of about half a second after
the first chunk at the RTF measured on an H200 (0.48); doubling (5, 10, 20, 25) holds up to an
RTF of 0.5 and costs two more decodes per answer. Each frame is `samples_per_frame` samples
(1920 at 24 kHz: 80 ms).

The decoder looks one step ahead (each transposed convolution's output is trimmed at both
ends), so a window's last 555 samples need the frame after it and are not made; the next
window, which holds that frame as context, starts its output 555 samples before its first
new frame and makes them. The chunks join into one whole-sequence decode, sample for sample
where the left context covers what a frame depends on (without left context those samples
are lost at every boundary: 23 ms). The shipped 25 frames of context are less than
Code2Wav's 72-frame attention window (as in transformers' own `chunked_decode`, 25), so
there the streamed speech approximates the whole decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .code2wav_graphs import WindowGraphs

SAMPLE_RATE = 24_000
Codes = npt.NDArray[np.int32]
Audio = npt.NDArray[np.float32]


class Code2WavRunner:
    def __init__(
        self,
        model: Any,
        *,
        max_batch: int = 8,
        lengths: Sequence[int] = (),
        capture: bool | None = None,
    ) -> None:
        """`model`: a Qwen3OmniMoeCode2Wav (transformers' modules are untyped). `lengths`:
        the window lengths to decode at fixed shapes (`window_lengths`; none: every window
        the plain way), batches of up to `max_batch`, captured as CUDA graphs with `capture`
        (None: on a GPU) once `warm` has run."""
        self.model = model
        self.samples_per_frame = int(model.total_upsample)
        self.quantizers = int(model.config.num_quantizers)
        self.device = next(model.parameters()).device
        self.graphs = WindowGraphs(model, lengths=lengths, max_batch=max_batch, capture=capture)

    def warm(self) -> None:
        """Capture every fixed shape now (on a GPU), before the stage says it is ready."""
        self.graphs.warm()

    @torch.inference_mode()
    def decode(self, frames: Codes, context: int) -> Audio:
        """Audio for `frames` ([n, 16]) minus the first `context` frames' samples."""
        return self.decode_batch([(frames, context)])[0]

    @torch.inference_mode()
    def decode_batch(self, windows: list[tuple[Codes, int]]) -> list[Audio]:
        """`decode` for several requests' windows in one forward pass.

        Code2Wav is causal throughout (causal attention, left-padded convolutions), so a
        window right-padded to the longest in the batch, or further to a fixed length,
        decodes its own frames exactly as alone; each row is cut back to its own length.
        A batch that fits a fixed shape replays its graph; any other runs `model(codes)`."""
        longest = max(len(frames) for frames, _ in windows)
        fixed = self.graphs.length_for(len(windows), longest)
        length = longest if fixed is None else fixed
        codes = np.zeros((len(windows), self.quantizers, length), dtype=np.int64)
        for row, (frames, _) in enumerate(windows):
            codes[row, :, : len(frames)] = frames.T
        if fixed is None:
            wav: torch.Tensor = self.model(torch.from_numpy(codes).to(self.device))[:, 0]
        else:
            wav = self.graphs.decode(codes)
        audio = wav.float().cpu().numpy()
        cut = self.samples_per_frame
        # `cut` samples a frame, less the last `short` (the decoder's lookahead: they need the
        # next frame), which a window with context makes for the window before it
        short = length * cut - audio.shape[-1]
        return [
            audio[row, max(context * cut - short, 0) : len(frames) * cut - short].copy()
            for row, (frames, context) in enumerate(windows)
        ]


def window_lengths(first_chunk: int, chunk: int, left_context: int) -> list[int]:
    """The lengths (context plus new frames) of the windows `FrameChunker` cuts, shortest
    first; the last is the longest any window has (a flush's partial window is shorter than
    the full one it stands for)."""
    chunker = FrameChunker(first_chunk=first_chunk, chunk=chunk, left_context=left_context)
    frame = np.zeros(1, dtype=np.int32)
    lengths: list[int] = []
    while True:  # once the chunk size and the context stop changing, the lengths repeat
        if (ready := chunker.push(frame)) is not None:
            if len(ready[0]) in lengths:
                return sorted(lengths)  # a first chunk above `chunk` is not the shortest
            lengths.append(len(ready[0]))


class FrameChunker:
    """One request's frames, cut into decode windows: bounded to context + one chunk."""

    def __init__(self, *, first_chunk: int = 5, chunk: int = 25, left_context: int = 25) -> None:
        if first_chunk < 1 or chunk < 1:
            raise ValueError("chunk sizes must be positive")
        if left_context < 1:  # the frame before a window makes its first samples
            raise ValueError(
                "left_context must be at least 1 frame: a window's first 555 samples come"
                " from the frame before it (the decoder looks a frame ahead), so without one"
                " every chunk boundary would be a gap"
            )
        self.first_chunk = first_chunk
        self.chunk = chunk
        self.left_context = left_context
        self._frames: list[Codes] = []
        self._context = 0
        """how many of `_frames` are already decoded (kept as context)"""
        self._size = first_chunk
        """frames the next chunk waits for"""

    def push(self, frame: Codes) -> tuple[Codes, int] | None:
        """Add a frame; return (window, context frames) when a chunk is complete."""
        self._frames.append(np.array(frame, dtype=np.int32))  # a copy: frames may be views
        if len(self._frames) - self._context >= self._size:
            return self._cut()
        return None

    def flush(self) -> tuple[Codes, int] | None:
        """The last, partial chunk (None if nothing is pending)."""
        if len(self._frames) > self._context:
            return self._cut()
        return None

    def _cut(self) -> tuple[Codes, int]:
        window = np.stack(self._frames)
        context = self._context
        self._size = min(self._size * 2, self.chunk)
        keep = min(self.left_context, len(self._frames))
        self._frames = self._frames[len(self._frames) - keep :]
        self._context = keep
        return window, context
