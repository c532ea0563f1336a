"""Choosing the next id from logits: greedy, or top-k / top-p sampling.

These are the transformers logits processors that Qwen3-Omni's `generate` configures, written
out so that the runners can step requests themselves: temperature, top-k, top-p, a repetition
penalty over what was already generated, and ids that may not be chosen. `pick` does one row
with a request's own seeded generator (reproducible, for the plain path and its tests);
`choose_rows` does a whole batch on the device with one host sync, as the cache-row path
needs (a sync per row per step was most of a batched step's host time).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
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


def sample_rows(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[rows, vocab] -> [rows] ids, without leaving the device (greedy at temperature 0)."""
    if sampling.temperature <= 0.0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / sampling.temperature
    k = min(sampling.top_k, scaled.shape[-1]) if sampling.top_k > 0 else scaled.shape[-1]
    values, ids = torch.topk(scaled, k, dim=-1)  # sorted, highest first
    probs = torch.softmax(values, dim=-1)
    if sampling.top_p < 1.0:
        probs = probs.masked_fill(probs.cumsum(dim=-1) - probs > sampling.top_p, 0.0)
    race = probs / torch.empty_like(probs).exponential_()
    return ids.gather(1, race.argmax(dim=-1, keepdim=True)).squeeze(1)


def choose_rows(
    logits: torch.Tensor,
    sampling: Sampling,
    *,
    banned: torch.Tensor | None = None,
    seen: Sequence[npt.NDArray[np.bool_]] = (),
) -> list[int]:
    """One id per row of [rows, vocab] logits: `banned` a [rows, vocab] mask of ids that may
    not be chosen, `seen` per row a [vocab] mask of ids already chosen (for the penalty)."""
    rows = logits.float()
    if sampling.repetition_penalty != 1.0 and len(seen):
        mask = torch.from_numpy(np.stack(seen)).to(rows.device)
        penalty = sampling.repetition_penalty
        rows = torch.where(mask, torch.where(rows > 0, rows / penalty, rows * penalty), rows)
    if banned is not None:
        rows = rows.masked_fill(banned, float("-inf"))
    chosen: list[int] = sample_rows(rows, sampling).tolist()
    return chosen
