"""Length buckets for decode attention: a step reads as much of its rows as they hold.

A cache row holds `max_length` positions (the graph's `max_context`), and a step that attends
over whole rows under a mask reads all of them for every row whatever was written: at 32 rows
x 8,192 positions the Thinker's step read ~24 GiB of KV, most of it masked out. Here a step
attends over the first `L` positions of its rows, `L` the smallest length bucket that holds
the longest stepped row after the step (its length plus the step's queries); positions past a
row's own length are masked as before. Buckets double from `shortest` (256 by default) up to
`max_length`, so a batch reads at most twice its longest row (and the longest row for every
row of the batch).

Why buckets and not attention with per-row lengths (flash-decoding): a CUDA graph holds fixed
shapes, so per-row lengths need a kernel that takes them as a device tensor. PyTorch's SDPA
takes none; flash-attn's `flash_attn_with_kvcache(cache_seqlens=...)` does, but it is a
separately built CUDA package this project does not ship, and it has no CPU path, so the
tiny-model tests would test another kernel than the GPU runs; FlexAttention needs
`torch.compile` of every step and a block mask rebuilt per step. Buckets keep the kernel
the steps already use (SDPA with the row mask, grouped-query attention natively), on the CPU
and the GPU alike; a masked position adds exactly zero, so a bucketed step gives what the
whole-row step gives up to the order of float sums.

The cost is graphs: one per (batch bucket, length bucket), all captured at warm-up (a
capture in the middle of a conversation would stall every row of the step). At the shipped
32 rows x 8,192 that is 6 x 6 = 36 Thinker graphs and 6 x 5 = 30 Talker graphs (4,096
positions), six and five times today's capture time; their memory is one shared pool (the
intermediates of one step: every graph's replays are serialised on the stage's stream) plus
each graph's small outputs. `shortest` = `max_length` is whole rows only, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Generic

import torch

from .step_graphs import OutputT, StepGraphs

log = logging.getLogger("parley.pipeline.qwen3_omni")

SHORTEST = 256
"""The shortest length bucket (positions): below it the weights' read dominates a step."""


def length_buckets(max_length: int, shortest: int = SHORTEST) -> list[int]:
    """`shortest`, twice that, ... up to and including `max_length`."""
    if max_length < 1 or shortest < 1:
        raise ValueError("max_length and the shortest bucket must be at least 1")
    lengths, length = [], shortest
    while length < max_length:
        lengths.append(length)
        length *= 2
    return [*lengths, max_length]


def at_length(step: Callable[[int, int], OutputT], length: int) -> Callable[[int], OutputT]:
    """`step` with its length fixed: a step over a batch, as `StepGraphs` takes it."""

    def over(batch: int) -> OutputT:
        return step(batch, length)

    return over


class LengthGraphs(Generic[OutputT]):
    """`StepGraphs` (batch buckets) per length bucket, sharing one graph memory pool."""

    def __init__(
        self,
        step: Callable[[int, int], OutputT],
        *,
        largest: int,
        lengths: Sequence[int],
        device: torch.device,
        capture: bool | None = None,
        name: str = "decode",
    ) -> None:
        """`step(batch, length)`: the step over the first `batch` rows, attending over their
        first `length` positions. `name`: whose steps they are, for the log."""
        self.name = name
        self.largest = largest
        self.lengths = sorted(set(lengths))
        """The length buckets, shortest first; the last is whole rows."""
        capture = device.type == "cuda" if capture is None else capture
        self.capture = capture
        pool = torch.cuda.graph_pool_handle() if capture and device.type == "cuda" else None
        self.by_length = {
            length: StepGraphs(
                at_length(step, length),
                largest=largest,
                device=device,
                capture=capture,
                pool=pool,
            )
            for length in self.lengths
        }

    def length(self, longest: int) -> int:
        """The length bucket a step whose longest row reaches `longest` positions attends over."""
        for length in self.lengths:
            if length >= longest:
                return length
        raise ValueError(
            f"a row of {longest} positions is longer than a cache row ({self.lengths[-1]})"
        )

    def run(self, count: int, length: int) -> OutputT:
        """The step over the first `count` rows (batch bucket), attending over `length` (a
        bucket); returns the step's outputs."""
        return self.by_length[length].run(count)

    def warm(self) -> None:
        """Capture every (batch, length) bucket now, so no request pays for a capture."""
        began = time.perf_counter()
        for graphs in self.by_length.values():
            graphs.warm()
        if self.capture:
            log.info(
                "%s: %d decode graphs captured in %.1f s (batch 1-%d x attention over %s "
                "positions)",
                self.name,
                self.count,
                time.perf_counter() - began,
                self.largest,
                ", ".join(str(n) for n in self.lengths),
            )

    @property
    def count(self) -> int:
        """How many graphs `warm` captures (on a GPU)."""
        return sum(len(graphs.buckets) for graphs in self.by_length.values())
