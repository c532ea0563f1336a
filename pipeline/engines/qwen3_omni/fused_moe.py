"""MoE layers for decode steps: every expert a batch needs, in a fixed number of kernels.

transformers' sparse MoE blocks (4.x, and 5.x's default) loop over the experts a batch hits:
for each one a `nonzero`, a gather and three small matmuls. At decode time that is 8 experts
x 48 layers of tiny kernels per Thinker token plus a host sync per layer, which makes a step
launch-bound and impossible to capture in a CUDA graph (data-dependent shapes). Here the
router's choices are sorted by expert and run as grouped matmuls (`grouped_mm`, one kernel
per projection reading each chosen expert's weights once, with per-expert row offsets that
stay on the device), so a step has fixed shapes and can be captured. Where grouped_mm is
missing, the chosen experts' weights are gathered per token and applied with `bmm` (the same
result, but each weight is read twice and copied once: measured 15 ms per full-size Thinker
step against ~1 ms of weights to read). Prefill (many tokens) keeps transformers' own loop.

transformers 4.x keeps each expert as its own MLP module, 5.x as two stacked parameters
([experts, 2 x intermediate, hidden] and [experts, hidden, intermediate]); both are served,
4.x by stacking a copy once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MAX_GATHERED_TOKENS = 64
"""Without grouped_mm, blocks given more tokens than this (a prefill) run transformers' own
forward: gathering every token's experts would copy gigabytes. With it, prefill takes the
grouped path too (no host sync per layer, each hit expert read once)."""


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    router: torch.Tensor
    """[experts, hidden]"""
    gate_up: torch.Tensor
    """[experts, 2 x intermediate, hidden]: gate rows first, then up rows"""
    down: torch.Tensor
    """[experts, hidden, intermediate]"""
    top_k: int
    normalize: bool
    act: Callable[[torch.Tensor], torch.Tensor]


def expert_weights(block: nn.Module) -> ExpertWeights:
    """The weights of a Qwen3-Omni sparse MoE block, in either transformers layout."""
    experts: Any = block.experts
    gate: Any = block.gate
    owner: Any = block
    act: Callable[[torch.Tensor], torch.Tensor]
    if isinstance(experts, nn.ModuleList):  # transformers 4.x: one MLP module per expert
        mlps: list[Any] = list(experts)
        gate_up = torch.stack(
            [torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in mlps]
        ).detach()
        down = torch.stack([e.down_proj.weight for e in mlps]).detach()
        act = mlps[0].act_fn
        top_k, normalize = int(owner.top_k), bool(owner.norm_topk_prob)
    else:  # transformers 5.x: stacked parameters
        gate_up, down, act = (
            experts.gate_up_proj.detach(),
            experts.down_proj.detach(),
            experts.act_fn,
        )
        top_k, normalize = int(gate.top_k), bool(gate.norm_topk_prob)
    return ExpertWeights(gate.weight.detach(), gate_up, down, top_k, normalize, act)


def _grouped_mm() -> Callable[..., torch.Tensor] | None:
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


GROUPED_MM = _grouped_mm()


def can_group(x: torch.Tensor) -> bool:
    """Whether grouped_mm serves `x` (CUDA's takes bfloat16 only)."""
    return GROUPED_MM is not None and (x.device.type != "cuda" or x.dtype == torch.bfloat16)


def routed_experts(
    x: torch.Tensor, w: ExpertWeights, *, grouped: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """[tokens, hidden] -> [tokens, hidden], the weighted sum of each token's top-k experts;
    and the router's logits."""
    logits = F.linear(x, w.router)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    weights, chosen = torch.topk(probs, w.top_k, dim=-1)
    if w.normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    flat = chosen.reshape(-1)
    rows = x.repeat_interleave(w.top_k, dim=0)  # [tokens x k, hidden], token-major
    if grouped and GROUPED_MM is not None and can_group(x):
        out = _grouped(rows, flat, w, GROUPED_MM)
    else:
        gate, up = torch.bmm(w.gate_up[flat], rows.unsqueeze(-1)).squeeze(-1).chunk(2, dim=-1)
        out = torch.bmm(w.down[flat], (w.act(gate) * up).unsqueeze(-1)).squeeze(-1)
    out = out.view(x.shape[0], w.top_k, -1) * weights.to(out.dtype).unsqueeze(-1)
    return out.sum(dim=1), logits


def _grouped(
    rows: torch.Tensor, experts: torch.Tensor, w: ExpertWeights, mm: Callable[..., torch.Tensor]
) -> torch.Tensor:
    """Each row through its expert: rows sorted by expert, one grouped matmul per projection
    (offsets counted on the device: no host sync), then back in the rows' order."""
    order = torch.argsort(experts)
    counts = torch.zeros(w.gate_up.shape[0], dtype=torch.int32, device=rows.device)
    counts.scatter_add_(0, experts, torch.ones_like(experts, dtype=torch.int32))
    offsets = counts.cumsum(0, dtype=torch.int32)
    gate, up = mm(rows[order], w.gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
    out = mm(w.act(gate) * up, w.down.transpose(-2, -1), offs=offsets)
    return torch.empty_like(out).index_copy_(0, order, out)


class FusedForward:
    """A sparse MoE block's forward: fused for few tokens, the block's own for many. It
    returns what the block's own forward does (4.x: with the router logits, 5.x: without)."""

    def __init__(self, block: nn.Module) -> None:
        self.weights = expert_weights(block)
        self.with_logits = isinstance(block.experts, nn.ModuleList)
        self.own = block.forward
        self.shared: nn.Module | None = getattr(block, "shared_expert", None)
        self.shared_gate: nn.Module | None = getattr(block, "shared_expert_gate", None)

    def __call__(self, hidden: torch.Tensor) -> Any:
        batch, length, size = hidden.shape
        if batch * length > MAX_GATHERED_TOKENS and not can_group(hidden):
            return self.own(hidden)
        x = hidden.reshape(-1, size)
        out, logits = routed_experts(x, self.weights)
        if self.shared is not None and self.shared_gate is not None:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        out = out.to(hidden.dtype).view(batch, length, size)
        return (out, logits) if self.with_logits else out


def install_fused_moe(model: nn.Module) -> int:
    """Give every Qwen3-Omni sparse MoE block in `model` the fused decode forward; returns how
    many blocks it changed. Idempotent."""
    changed = 0
    for module in model.modules():
        if type(module).__name__.endswith("SparseMoeBlock") and not isinstance(
            module.forward, FusedForward
        ):
            module.forward = FusedForward(module)
            changed += 1
    return changed
