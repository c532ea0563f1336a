"""Choosing the next id from logits: greedy, or top-k / top-p sampling with a seeded generator.

These are the transformers logits processors that Qwen3-Omni's `generate` configures, written
out for one row so that the runners can step requests themselves: temperature, top-k, top-p,
a repetition penalty over what was already generated, and ids that may not be chosen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 0.0
    """0 is greedy."""
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0


def pick(
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    *,
    banned: torch.Tensor | None = None,
    seen: Iterable[int] = (),
) -> int:
    """One id from a [vocab] row of logits."""
    row = logits.float().clone()
    if sampling.repetition_penalty != 1.0:
        ids = torch.tensor(sorted(set(seen)), dtype=torch.long, device=row.device)
        if len(ids):
            values = row[ids]
            penalty = sampling.repetition_penalty
            row[ids] = torch.where(values > 0, values / penalty, values * penalty)
    if banned is not None and len(banned):
        row[banned] = float("-inf")
    if sampling.temperature <= 0.0:
        return int(row.argmax())
    row = row / sampling.temperature
    if sampling.top_k > 0:
        k = min(sampling.top_k, row.shape[-1])
        kth = torch.topk(row, k).values[-1]
        row[row < kth] = float("-inf")
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(row, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(ordered, dim=-1) > sampling.top_p
        row[order[drop]] = float("-inf")
    probs = torch.softmax(row, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))
