"""The GPU engines' side of sizing: their settings, the device's figures, the KV of a token.

`memory_plan.py` decides from figures; this module reads them. A stage sizes itself once its
weights are loaded: `DeviceFigures` from `torch.cuda` (free and total as the driver says,
what this process's allocator holds), or from a `MemoryQuery` handed in. The query is the
seam the CPU tests use: a stage given one sizes itself with its figures on any device, so
the GPU path runs in CI without a GPU. A stage on the CPU with no query keeps the rows its
file gives (`auto` there: `max_rows`), since a host's memory is not what bounds the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..memory_plan import DEFAULT_UTILIZATION, count_setting, fraction_setting


@dataclass(frozen=True, slots=True)
class DeviceFigures:
    total: int
    free: int
    allocated: int
    """What this process's torch allocator holds on the device (its weights, so far)."""


MemoryQuery = Callable[[str], DeviceFigures]


def cuda_figures(device: str) -> DeviceFigures:
    """The device's memory as the driver and this process's allocator see it now."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return DeviceFigures(total=total, free=free, allocated=torch.cuda.memory_allocated(device))


@dataclass(frozen=True, slots=True)
class SizingSettings:
    """A GPU engine's sizing arguments (the graph file's engine_args)."""

    max_rows: int
    utilization: float = DEFAULT_UTILIZATION
    kv_share: float = 1.0
    query: MemoryQuery | None = None

    @classmethod
    def of(
        cls,
        *,
        max_rows: object,
        gpu_memory_utilization: object = DEFAULT_UTILIZATION,
        kv_share: object = 1.0,
        memory_query: MemoryQuery | None = None,
    ) -> SizingSettings:
        return cls(
            max_rows=count_setting(max_rows, "max_rows"),
            utilization=fraction_setting(gpu_memory_utilization, "gpu_memory_utilization"),
            kv_share=fraction_setting(kv_share, "kv_share"),
            query=memory_query,
        )

    def figures(self, device: str) -> DeviceFigures | None:
        """The device's figures if this stage sizes itself there (CUDA, or a query given)."""
        if self.query is not None:
            return self.query(device)
        if torch.device(device).type == "cuda":
            return cuda_figures(device)
        return None


def kv_token_bytes(config: Any, dtype: torch.dtype) -> int:
    """Keys and values of one position over every layer of a decoder's text config."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    element = torch.empty((), dtype=dtype).element_size()
    return int(config.num_hidden_layers) * kv_heads * head_dim * 2 * element
