"""Code2Wav decode windows at fixed shapes, replayed as CUDA graphs on a GPU.

Run eagerly, one Code2Wav window is hundreds of small kernel launches (a sliding-window
transformer, then a chain of convolutions and transposed convolutions), each launched from
Python. When the three stages share a process their model threads share the GIL, and every
launch waits for it: Code2Wav's first chunk was measured at 211 ms there against 34 ms alone.
A captured graph replays all of them with one launch (`StepGraphs`, as the Thinker and
Talker decode steps do).

A capture holds one shape, so windows are right-padded to a length bucket and the batch to
a batch bucket (1, 2, 4, ..., max_batch), one graph per pair, all captured at `warm`. Padding
is free of effects because Code2Wav is causal in time throughout: causal attention within its
sliding window, left-padded convolutions, and transposed convolutions trimmed at the end so
that no sample kept depends on a later frame. On the tiny model a window padded from 1-50
frames to 64-100 gives its own samples to within float rounding (under 1e-6 of its peak). The
length buckets are the lengths of the engine's own windows (`code2wav_runner.window_lengths`),
so a full window pads nothing; a last, partial window does (and, as before, a short window
batched with a longer one).

The forward below is the model's modules called in `Qwen3OmniMoeCode2Wav.forward`'s order,
not `model(codes)`, because the transformer part's `forward` cannot be captured as it is:
it builds its masks through transformers' masking_utils, which in 5.x checks the positions
for packed sequences with a Python `if` on a device tensor (a host sync on every call, and
skipped while a stream captures, so a captured step would take another mask path than the
eager one); it also goes through output-recording decorators and may open a KV cache. Here
the layers get no mask and SDPA's own causal flag, which is what the model's sliding-window
mask reduces to while a window is no longer than the window (72 frames in Qwen3-Omni; longer
lengths are not bucketed and decode the plain way). The rotary tables are fixed per length
and made once. The rest of the forward (embeddings, norms, convolutions, slicing by shapes)
has no host sync and no branch on values.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .step_graphs import StepGraphs

Rotary = tuple[torch.Tensor, torch.Tensor]


def window_forward(model: Any, codes: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """`model(codes)` for codes [batch, quantizers, frames]: audio [batch, 1, samples], with
    `rotary` (cos, sin) for positions 0..frames-1 (`rotary_tables`). Needs SDPA attention,
    which takes no mask as causal."""
    hidden = model.code_embedding(codes + model.code_offset).mean(1)
    body = model.pre_transformer
    for layer in body.layers[: body.config.num_hidden_layers]:
        out = layer(hidden, attention_mask=None, position_embeddings=rotary)
        hidden = out[0] if isinstance(out, tuple) else out
    hidden = body.norm(hidden).permute(0, 2, 1)
    for blocks in model.upsample:
        for block in blocks:
            hidden = block(hidden)
    for block in model.decoder:
        hidden = block(hidden)
    wav: torch.Tensor = hidden.clamp(min=-1, max=1)
    return wav


@torch.inference_mode()
def rotary_tables(model: Any, frames: int) -> Rotary:
    """The transformer's rotary (cos, sin) for positions 0..frames-1, as its forward makes
    them (one row, broadcast over the batch)."""
    parameter = next(model.parameters())
    body = model.pre_transformer
    positions = torch.arange(frames, device=parameter.device).unsqueeze(0)
    template = torch.zeros(
        1, frames, int(body.config.hidden_size), dtype=parameter.dtype, device=parameter.device
    )
    cos, sin = body.rotary_emb(template, positions)
    return cos, sin


def graphable_lengths(model: Any, lengths: Sequence[int]) -> list[int]:
    """The lengths among `lengths` that `window_forward` decodes as `model(codes)` does."""
    config = model.pre_transformer.config  # the one its attention layers read
    if config._attn_implementation != "sdpa":
        return []  # eager attention reads no causal flag: without a mask it would look ahead
    window = getattr(config, "sliding_window", None)
    return sorted({n for n in lengths if n >= 1 and (window is None or n <= window)})


class WindowGraphs:
    """One static codes buffer per length bucket and a `StepGraphs` over it (its batch
    buckets), so a batch of windows is one replay."""

    def __init__(
        self,
        model: Any,
        *,
        lengths: Sequence[int],
        max_batch: int,
        capture: bool | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.model = model
        self.device = next(model.parameters()).device
        self.max_batch = max_batch
        self.lengths = graphable_lengths(model, lengths)
        """The length buckets, shortest first (empty: every window decodes plainly)."""
        quantizers = int(model.config.num_quantizers)
        self._codes: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, StepGraphs[torch.Tensor]] = {}
        capture = self.device.type == "cuda" if capture is None else capture
        # one memory pool for every length bucket (their replays never overlap: one model
        # thread): a pool each held the sum of the buckets' activations, ~5.2 GiB for the
        # stage on an H100 where the graph's sizing counts 1 GiB beside its weights, and the
        # Thinker ran out of memory once a conversation's prompt grew (2026-12-06)
        pool = torch.cuda.graph_pool_handle() if capture and self.device.type == "cuda" else None
        for length in self.lengths:
            codes = torch.zeros(max_batch, quantizers, length, dtype=torch.long, device=self.device)
            step = functools.partial(self._step, codes, rotary_tables(model, length))
            self._codes[length] = codes
            self.graphs[length] = StepGraphs(
                step, largest=max_batch, device=self.device, capture=capture, pool=pool
            )

    def _step(self, codes: torch.Tensor, rotary: Rotary, batch: int) -> torch.Tensor:
        return window_forward(self.model, codes[:batch], rotary)[:, 0]

    def length_for(self, count: int, longest: int) -> int | None:
        """The length bucket a batch of `count` windows, the longest `longest` frames, decodes
        at; None if none holds it (then it decodes plainly)."""
        if count > self.max_batch:
            return None
        return next((n for n in self.lengths if n >= longest), None)

    def decode(self, codes: np.ndarray[Any, np.dtype[np.int64]]) -> torch.Tensor:
        """Audio [count, samples] for codes [count, quantizers, length] with `length` a bucket
        (`length_for`): the graph's own output, valid until the next replay."""
        count, _, length = codes.shape
        self._codes[length][:count].copy_(torch.from_numpy(codes))
        return self.graphs[length].run(count)[:count]

    def warm(self) -> None:
        """Capture every (length, batch) bucket now, so no request pays for a capture."""
        for graphs in self.graphs.values():
            graphs.warm()
