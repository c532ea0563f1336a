"""A static KV cache with one row per request in flight: decode steps read and write in place.

Continuous batching over per-request DynamicCaches copies every cache into a padded batch and
back out at every step (batch_cache.py), and a step whose tensors change shape every time
cannot be captured. Here each layer's keys and values live in one preallocated tensor of
[rows, kv_heads, max_length, head_dim]. A request takes a row when its decode starts (its
prefill's cache is copied in once), every step writes each row's new position in place
(`write_at`: a per-row position, so rows of different lengths batch without padding) and
attends over its row under a mask of the positions it has written; the request gives the
row back when it ends, copying its cache out only if it is wanted (session reuse).

A step attends over the first `attend` positions of its rows, not all `max_length`: the
step chooses a length that holds its longest row (slot_decoder.py's length buckets), so
what it reads grows with the rows' real lengths. The host keeps its own copy of each row's
length (`lengths`) to choose it without reading the device.

Rows in use are kept packed at the front (a freed row takes the last row's contents), so a
step over `n` requests runs over the first `n` rows, or the smallest captured batch size
above. A row inside that batch whose request is not stepping (waiting for its input) is
computed anyway; its `write_at` is where it will write next, so what the spare computation
writes there is overwritten by its own next step before anything reads it (it writes there
even when that is past the step's `attend`; only its output, which nothing reads, differs).

The object is the cache the attention layers see: transformers' attention modules only call
`update(keys, values, layer_idx, ...)` on it, in every version this code supports.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


class SlotCache:
    def __init__(
        self,
        *,
        layers: int,
        rows: int,
        kv_heads: int,
        max_length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (rows, kv_heads, max_length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.rows = rows
        self.max_length = max_length
        self.write_at = torch.zeros(rows, dtype=torch.long, device=device)
        """Per row: the position this step's first token is written at (its length so far)."""
        self.lengths = [0] * rows
        """The host's copy of `write_at`, kept by `take`, `advance` and `give_back`. A step
        that moves `write_at` on the device itself (the code predictor's frame, whose rows
        start afresh every frame) does not keep it, and attends over whole rows."""
        self.attend = max_length
        """Positions of each row the current step's attention reads (`update`, `mask`): at
        least the longest row's length after the step; past a row's own length its mask
        hides them."""
        self._row_ids = torch.arange(rows, device=device)
        self._positions = torch.arange(max_length, device=device)
        self.batch = rows
        """How many rows (from the front) the current step computes."""
        self._owners: list[Any] = []
        """What holds each row in use, in row order (rows in use are packed at the front)."""

    # --- the attention layers' side --------------------------------------------------------

    def update(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's keys and values ([batch, heads, q, dim]) at each row's position and
        return the batch's rows, their first `attend` positions, for attention."""
        batch, queries = keys.shape[0], keys.shape[2]
        rows = self._row_ids[:batch]
        for j in range(queries):
            at = self.write_at[:batch] + j
            self.keys[layer_idx][rows, :, at] = keys[:, :, j]
            self.values[layer_idx][rows, :, at] = values[:, :, j]
        attend = self.attend
        return self.keys[layer_idx][:batch, :, :attend], self.values[layer_idx][:batch, :, :attend]

    def mask(self, batch: int, queries: int = 1) -> torch.Tensor:
        """[batch, 1, queries, attend] bool: query j of row r sees positions up to its own."""
        last = self.write_at[:batch, None] + torch.arange(queries, device=self.write_at.device)
        positions = self._positions[: self.attend]
        return (positions[None, None, :] <= last[:, :, None]).unsqueeze(1)

    def longest(self, rows: list[int], queries: int = 1) -> int:
        """The longest of `rows` after a step of `queries` positions: what it must attend over."""
        return max(self.lengths[row] for row in rows) + queries

    def advance(self, rows: list[int], on_device: torch.Tensor) -> None:
        """`rows` (also as a device tensor, `on_device`) have each written one more position."""
        self.write_at.index_add_(0, on_device, torch.ones_like(on_device))
        for row in rows:
            self.lengths[row] += 1

    # --- rows ------------------------------------------------------------------------------

    @property
    def in_use(self) -> int:
        return len(self._owners)

    @property
    def nbytes(self) -> int:
        """Device memory of the rows' keys and values."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def row_of(self, owner: Any) -> int:
        for row, held in enumerate(self._owners):
            if held is owner:
                return row
        raise KeyError("no row is held by this owner")

    def holds(self, owner: Any) -> bool:
        return any(held is owner for held in self._owners)

    def take(self, owner: Any, cache: DynamicCache | None, length: int) -> int | None:
        """A row for `owner`, holding `cache`'s first `length` positions; None when every row
        is in use or the request could outgrow a row (`length` is its final length)."""
        if len(self._owners) >= self.rows or length > self.max_length:
            return None
        row = len(self._owners)
        self._owners.append(owner)
        if cache is not None:
            for index, layer in enumerate(cache.layers):
                assert layer.keys is not None and layer.values is not None
                n = layer.keys.shape[2]
                self.keys[index][row, :, :n] = layer.keys[0]
                self.values[index][row, :, :n] = layer.values[0]
            self.lengths[row] = cache.get_seq_length()
        else:
            self.lengths[row] = 0
        self.write_at[row] = self.lengths[row]
        return row

    def seat(self, state: Any, reserve: int) -> bool:
        """Whether `state` (a runner's request: `.cache`, `.length`) holds a row, taking one
        for it if it can: its prefill cache is copied in and `state.cache` emptied (the row
        holds its KV now). `reserve`: positions it may still add."""
        if self.holds(state):
            return True
        if self.take(state, state.cache, state.length + reserve) is None:
            return False
        state.cache = DynamicCache()
        return True

    def cache_of(self, owner: Any, length: int) -> DynamicCache:
        """A copy of `owner`'s first `length` positions as a batch-of-one DynamicCache."""
        row = self.row_of(owner)
        cache = DynamicCache()
        for index, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            cache.update(
                keys[row : row + 1, :, :length].clone(),
                values[row : row + 1, :, :length].clone(),
                index,
            )
        return cache

    def give_back(self, owner: Any) -> None:
        """Free `owner`'s row; the last row in use moves into it (the positions it has
        written: nothing reads past them before they are written again). Idempotent."""
        if not self.holds(owner):
            return
        row = self.row_of(owner)
        last = len(self._owners) - 1
        if row != last:
            written = self.lengths[last]
            for keys, values in zip(self.keys, self.values, strict=True):
                keys[row, :, :written].copy_(keys[last, :, :written])
                values[row, :, :written].copy_(values[last, :, :written])
            self.write_at[row] = written
            self.lengths[row] = written
            self._owners[row] = self._owners[last]
        self._owners.pop()
        self.write_at[last] = 0
        self.lengths[last] = 0
