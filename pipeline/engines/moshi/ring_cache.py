"""Moshi's KV cache: one row per session, each a ring of the last `window` positions.

Moshi attends over a sliding window of 3,000 frames (four minutes). A session's keys and
values live in its row of one preallocated tensor per layer, [rows, heads, window, dim]; a
step writes each row's new position at `written % window`, overwriting the oldest, and the
row attends over what it holds. Rotary positions are applied before the keys are stored,
so the order inside the ring does not matter to attention. Rows of different lengths step
together: each writes at its own place and sees its own mask.

A step computes the first `batch` rows (the stepper keeps its sessions in the lowest rows:
frame_step.py), so attention reads those rows where they lie, a view of the cache. Gathering
rows by index instead copied every layer's whole window each step (~50 GB at 32 sessions
with full windows, half of a full-size step on an H200).

The attention layers only call `update(keys, values, layer_idx, ...)`, in every
transformers version this code supports (4.57 and 5.x).
"""

from __future__ import annotations

from typing import Any

import torch


class RingCache:
    def __init__(
        self,
        *,
        layers: int,
        rows: int,
        heads: int,
        window: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (rows, heads, window, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.window = window
        self.written = torch.zeros(rows, dtype=torch.long, device=device)
        """Per row: positions written so far (the next one's rotary position)."""
        self._rows = torch.arange(rows, device=device)
        self._slots = torch.arange(window, device=device)

    def update(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's keys and values ([batch, heads, 1, dim]) into the first `batch`
        rows' rings and return those rows whole (a view, not a copy)."""
        batch = keys.shape[0]
        rows = self._rows[:batch]
        at = self.written[:batch] % self.window
        self.keys[layer_idx][rows, :, at] = keys[:, :, 0]
        self.values[layer_idx][rows, :, at] = values[:, :, 0]
        return self.keys[layer_idx][:batch], self.values[layer_idx][:batch]

    def mask(self, batch: int) -> torch.Tensor:
        """[batch, 1, 1, window] bool: the slots each of the first `batch` rows holds after
        this step's write."""
        held = torch.clamp(self.written[:batch] + 1, max=self.window)
        return (self._slots[None, :] < held[:, None])[:, None, None, :]

    def clear(self, row: int) -> None:
        """A row for a new session: nothing held (its old contents are masked out)."""
        self.written[row] = 0

    def move(self, source: int, target: int) -> None:
        """Row `source`'s session into row `target` (the stepper keeps its rows compact)."""
        for layer in range(len(self.keys)):
            self.keys[layer][target].copy_(self.keys[layer][source])
            self.values[layer][target].copy_(self.values[layer][source])
        self.written[target] = self.written[source]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.written.max().item()) if self.written.numel() else 0
