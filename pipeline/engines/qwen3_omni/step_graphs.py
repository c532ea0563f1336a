"""Decode steps captured as CUDA graphs, one per batch size, replayed for every step after.

A decode step of a MoE model is thousands of small kernels whose launch costs more than
their work (the Thinker's plain step measured ~90 ms per token on an H200, launch-bound). A
CUDA graph records the step's kernels once and replays them with a single launch; what a
replay needs is that every tensor it touches stays at the same address with the same shape.
So a step function reads its inputs from static buffers (filled before each replay) and its
outputs are the graph's own tensors (valid until the next replay: copy them out first).

Batch sizes are bucketed (1, 2, 4, 8, ...): a step over `n` requests runs the smallest
bucket that holds them. On a CPU (the tiny model in CI) the same step function simply runs,
so the captured path and the plain one are one code path, tested on both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from ...step_watch import long_step

OutputT = TypeVar("OutputT")

CAPTURE_S = 600.0
"""How long one bucket's capture may take before its stage counts as hung: a capture of a
large MoE step records thousands of kernels, and a compiled step compiles its layers on its
first bucket (compiled_steps.py), far longer than the stage's bound for a step."""


def buckets_up_to(largest: int) -> list[int]:
    """1, 2, 4, ... up to and including `largest`."""
    sizes, size = [], 1
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


class StepGraphs(Generic[OutputT]):
    def __init__(
        self,
        step: Callable[[int], OutputT],
        *,
        largest: int,
        device: torch.device,
        capture: bool | None = None,
        pool: Any = None,
    ) -> None:
        """`pool`: a graph memory pool (`torch.cuda.graph_pool_handle()`) shared with other
        `StepGraphs` whose steps never run at once (row_lengths.py); None: one of its own."""
        self.step = step
        self.buckets = buckets_up_to(largest)
        self.capture = device.type == "cuda" if capture is None else capture
        self.device = device
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, OutputT]] = {}
        self._pool: Any = pool

    def bucket(self, count: int) -> int:
        for size in self.buckets:
            if size >= count:
                return size
        raise ValueError(f"a step of {count} is more than the largest batch ({self.buckets[-1]})")

    @torch.inference_mode()
    def run(self, count: int) -> OutputT:
        """Run the step over the first `bucket(count)` rows; returns the step's outputs."""
        size = self.bucket(count)
        if not self.capture:
            return self.step(size)
        if size not in self._graphs:
            self._graphs[size] = self._record(size)
        graph, outputs = self._graphs[size]
        graph.replay()
        return outputs

    def warm(self) -> None:
        """Capture every bucket now, so that no request pays for a capture."""
        if self.capture:
            with torch.inference_mode():
                for size in self.buckets:
                    if size not in self._graphs:
                        self._graphs[size] = self._record(size)

    def _record(self, size: int) -> tuple[torch.cuda.CUDAGraph, OutputT]:
        with long_step(CAPTURE_S):  # a step of its own, however long: not a hang
            return self._capture(size)

    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, OutputT]:
        # Warm-up runs on a side stream first (cuBLAS workspaces, lazy inits), as the CUDA
        # graph docs ask; the step's writes are idempotent for the same inputs.
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.step(size)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self.step(size)
        return graph, outputs
