"""What Mimi carries from one 80 ms frame to the next, one row per session, in static buffers.

Mimi (Moshi's codec) is causal: a frame's codes depend on every sample before it, and a
frame's audio on every code before it. Streamed a frame at a time, each direction keeps:

- each causal convolution's left context: the last `kernel - stride` samples of its input
  (dilation counted), which the whole-sequence model gets from the frame before and which
  is zero (or, for the `replicate` downsampling, the first sample) at the start;
- each transposed convolution's overlap: the last `kernel - stride` samples of its output,
  which the next frame's output adds to its first ones (without the bias, counted once);
- its transformer's keys and values (`MimiRing`), whose attention reaches `window` steps back.

Everything is preallocated for every row and updated in place, so a CUDA graph captured over
the first `size` rows reads and writes the same addresses every replay. A step reads the
convolutions' `held` state and writes `next`; `commit` then copies `next` into `held` and
advances the ring's counters, for the rows that stepped. Until that commit a step changes
nothing it reads, so it may run again with the same result (the capture runs it three
times: two warm-ups and the capture), and a bucket's spare rows never disturb state.
"""

from __future__ import annotations

from typing import Any

import torch

ALIGN = 8
"""Ring slots come in multiples of this."""


class ConvStates:
    """One direction's convolution states, each [rows, channels, length], as views of one
    flat buffer per phase (`held`, `next`), so a commit is one copy."""

    def __init__(
        self,
        shapes: list[tuple[int, int]],
        *,
        rows: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        total = sum(channels * length for channels, length in shapes)
        self.held = torch.zeros(rows, total, dtype=dtype, device=device)
        self.next = torch.zeros(rows, total, dtype=dtype, device=device)
        self._held: list[torch.Tensor] = []
        self._next: list[torch.Tensor] = []
        start = 0
        for channels, length in shapes:
            end = start + channels * length
            self._held.append(self.held[:, start:end].view(rows, channels, length))
            self._next.append(self.next[:, start:end].view(rows, channels, length))
            start = end

    def held_of(self, index: int, size: int) -> torch.Tensor:
        return self._held[index][:size]

    def next_of(self, index: int, size: int) -> torch.Tensor:
        return self._next[index][:size]

    def commit(self, size: int) -> None:
        self.held[:size].copy_(self.next[:size])

    def reset(self, row: int) -> None:
        self.held[row].zero_()

    def move(self, source: int, target: int) -> None:
        self.held[target].copy_(self.held[source])

    def tensors(self) -> list[torch.Tensor]:
        return [self.held, self.next]


class MimiRing:
    """Keys and values of Mimi's transformer, per row a ring of at least `window + steps - 1`
    slots.

    Mimi's transformer runs `steps` positions a frame (2: it works at 25 Hz, the codes at
    12.5 Hz) and each position attends over itself and the `window - 1` before it (Kyutai's
    context, 250; the whole-sequence mask `0 <= query - key < window`). The ring holds one
    slot more than the window per extra step, so the frame's first position still sees the
    oldest key it may while the frame's last one is written, rounded up to a multiple of 8
    (256 at full size: rows the GPU's attention kernels take unpadded). Keys are stored
    after their rotary embedding, so the order inside the ring does not matter; each slot's
    position is worked out from how many the row has written, and the mask follows from it.

    The attention layers only call `update(keys, values, layer_idx, ...)`."""

    def __init__(
        self,
        *,
        layers: int,
        rows: int,
        heads: int,
        head_dim: int,
        window: int,
        steps: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.window, self.steps = window, steps
        self.capacity = -(-(window + steps - 1) // ALIGN) * ALIGN
        shape = (rows, heads, self.capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.written = torch.zeros(rows, dtype=torch.long, device=device)
        """Per row: positions written so far (the frame's first position)."""
        self._rows = torch.arange(rows, device=device)[:, None]
        self._offsets = torch.arange(steps, device=device)
        self._slots = torch.arange(self.capacity, device=device)
        self._open = torch.zeros((), dtype=dtype, device=device)
        self._blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)

    def positions(self, size: int) -> torch.Tensor:
        """[size, steps]: the positions this frame writes (rotary positions too)."""
        return self.written[:size, None] + self._offsets

    def update(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the frame's keys and values ([batch, heads, steps, dim]) into the first
        `batch` rows' rings; those rows whole (views)."""
        batch = keys.shape[0]
        at = self.positions(batch) % self.capacity
        rows = self._rows[:batch]
        self.keys[layer_idx][rows, :, at] = keys.transpose(1, 2)
        self.values[layer_idx][rows, :, at] = values.transpose(1, 2)
        return self.keys[layer_idx][:batch], self.values[layer_idx][:batch]

    def mask(self, size: int) -> torch.Tensor:
        """[size, 1, steps, capacity], additive: 0 where a query sees a slot, the dtype's
        minimum where the slot is empty, in its future or `window` or more steps back."""
        last = (self.written[:size] + self.steps - 1)[:, None]
        held = (last - (last - self._slots) % self.capacity)[:, None, :]  # each slot's position
        query = self.positions(size)[:, :, None]
        seen = (held >= 0) & (held <= query) & (held > query - self.window)
        return torch.where(seen, self._open, self._blocked)[:, None]

    def commit(self, size: int) -> None:
        self.written[:size] += self.steps

    def reset(self, row: int) -> None:
        """A new session: nothing written (zeroed too, so no stale value meets the mask)."""
        self.written[row] = 0
        for layer in range(len(self.keys)):
            self.keys[layer][row].zero_()
            self.values[layer][row].zero_()

    def move(self, source: int, target: int) -> None:
        for layer in range(len(self.keys)):
            self.keys[layer][target].copy_(self.keys[layer][source])
            self.values[layer][target].copy_(self.values[layer][source])
        self.written[target] = self.written[source]

    def tensors(self) -> list[torch.Tensor]:
        return [*self.keys, *self.values, self.written]
