"""Weight-only int8 Linear layers for the Thinker's model on a CPU.

Decoding a token of SmolLM2-135M is a chain of small matrix-vector products, bound by how
fast the weights stream from memory: a quarter of the bytes (int8 rather than float32) is most
of the win. Each Linear's weight is quantised once, at load, per output channel (symmetric:
row / scale rounded to [-127, 127], scale = the row's largest magnitude / 127), and the layer
then runs through `torch._weight_int8pack_mm`, which multiplies by the int8 rows and scales the
outputs by the float scales.

That kernel is fast only with bfloat16 activations: with float32 ones torch 2.13 takes a
reference path ten times slower than float32's own matmul. So the layer casts its input to
bfloat16 and its output back to the input's dtype; norms, attention, the embedding and
everything between the layers stay float32 as before.

A prefill is a matrix-matrix product, where the kernel loses to float32's (6.4 against 5.1 ms
for 256 rows of a 1536 x 576 layer on one thread here). From `PREFILL_ROWS` rows on, the
layer instead widens its weight to bfloat16 and runs a bfloat16 matmul: 2.6 ms, the widening
included. Both paths multiply by the same int8 weights and scales.

A few layers stay float32: those fed a massive activation. Like larger LMs, SmolLM2 carries
one channel in its residual stream tens of thousands of times the size of the others (into
layer 11's down_proj: 45,000x the input's median on a chat prompt), and rounding the
weights that multiply it perturbs everything after. Quantising that one layer alone moved
the next-token distribution half as far (KL) as quantising all 210, so `massive_inputs` finds
such layers on a calibration prompt at load (input peak over `MASSIVE_RATIO` x its median)
and they are left as they are (two of 210 here, layers 11 and 28).

The vocabulary projection (lm_head, tied to the embedding in SmolLM2) is quantised too when
`include_head` is set: 49152 x 576 is a fifth of the weights and ~11 ms of a token's ~50 ms
on one thread in float32, ~4.5 ms in int8. It then gets its own int8 copy and the embedding
keeps the float one (the tie is broken, +28 MB).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch
from torch import nn

HEAD = "lm_head"
MASSIVE_RATIO = 10_000.0
"""A Linear whose input peaks above this many times its median magnitude stays float32."""
PREFILL_ROWS = 32
"""From this many rows on, a bfloat16 matmul on the widened weight beats the int8 kernel."""


class Int8Linear(nn.Module):
    """y = x @ (q * scale).T + bias, with q int8 [out, in] and one scale per output row."""

    weight_int8: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        quantised = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.register_buffer("weight_int8", quantised.contiguous())
        self.register_buffer("scales", scales.to(torch.bfloat16))
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.shape[0] >= PREFILL_ROWS:
            weight = self.weight_int8.to(torch.bfloat16) * self.scales[:, None]
            out = torch.nn.functional.linear(rows, weight).to(x.dtype)
        else:
            out = torch._weight_int8pack_mm(rows, self.weight_int8, self.scales).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def massive_inputs(
    model: nn.Module, input_ids: torch.Tensor, ratio: float = MASSIVE_RATIO
) -> set[str]:
    """The Linear layers whose input, over one forward pass of `input_ids`, peaks above
    `ratio` times its median magnitude."""
    found: set[str] = set()

    def watch(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def seen(_: nn.Module, args: tuple[torch.Tensor, ...], __: torch.Tensor) -> None:
            magnitude = args[0].detach().abs()
            if magnitude.amax() > ratio * magnitude.median().clamp(min=1e-12):
                found.add(name)

        return seen

    hooks = [
        module.register_forward_hook(watch(name))
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
    try:
        with torch.inference_mode():
            model(input_ids=input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return found


def quantise_linears(
    model: nn.Module, *, include_head: bool, keep: Collection[str] = ()
) -> list[str]:
    """Replace the model's Linear layers, except those named in `keep`, by `Int8Linear` in
    place; returns the names of those replaced.

    The head is left alone unless `include_head`; when quantised, the model's config stops
    tying it to the embedding, so nothing re-ties them later."""
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and (include_head or name != HEAD) and name not in keep
    ]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Int8Linear(linear))
    config = getattr(model, "config", None)
    if include_head and config is not None and hasattr(config, "tie_word_embeddings"):
        config.tie_word_embeddings = False
    return [name for name, _ in targets]
