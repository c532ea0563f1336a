"""One decode step of a transformers decoder stack for every request holding a cache row.

The step calls the model's own modules (its rotary embedding, decoder layers and final norm)
but not the model's `forward`: that wrapper builds masks from the cache's length, records
hidden states through hooks and differs between transformers versions, none of which a
captured step can have. The layers see a `SlotCache` and a mask from it; the step reads its
inputs from static buffers (`embeds`, `positions`), so `StepGraphs` can capture it.

Outputs per row: the input embedding, the input of layer `keep_input_of` (what transformers
calls `hidden_states[keep_input_of]`; the Thinker hands it to the Talker) and the final
normed hidden state (the LM head's input).

A step attends over the first positions of its rows that hold its longest row (a length
bucket, row_lengths.py), not over whole rows: what it reads grows with the conversations.

Attention over a row is transformers' SDPA without its `repeat_kv`: that expands every key
and value to one copy per query head before the kernel, a copy of the whole row per layer
per step (measured 3.5 ms of a 15 ms full-size Thinker step at 4096 positions, and growing
with every row in the batch); SDPA's own grouped-query support reads the row as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface

from .row_lengths import SHORTEST, LengthGraphs, length_buckets
from .slot_cache import SlotCache

ROWS_ATTENTION = "parley_rows_sdpa"


def rows_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: [batch, heads, q, dim] in, [batch, q,
    heads, dim] out; the mask is the row mask (every step here passes one)."""
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ROWS_ATTENTION, rows_attention)


@dataclass(frozen=True, slots=True)
class StepRows:
    embeds: torch.Tensor
    kept: torch.Tensor
    last: torch.Tensor
    """each [rows stepped, hidden], in the order the step was asked for"""


LayerCall = Callable[[nn.Module, torch.Tensor, torch.Tensor, SlotCache, Any], torch.Tensor]
"""(layer, hidden, mask, cache, rotary cos and sin) -> the layer's output hidden states."""


def call_layer(
    layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor, cache: SlotCache, cos_sin: Any
) -> torch.Tensor:
    """One decoder layer of a step (compiled_steps compiles this function)."""
    out = layer(
        hidden,
        attention_mask=mask,
        position_ids=None,
        past_key_values=cache,
        use_cache=True,
        position_embeddings=cos_sin,
    )
    result: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return result


def run_layers(
    body: Any,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    cache: SlotCache,
    *,
    keep_input_of: int | None = None,
    layer_call: LayerCall = call_layer,
    attend: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The decoder stack over `hidden` ([batch, queries, size]) at `positions`; the normed
    output and the input of layer `keep_input_of` (the normed output if it is the last).
    `attend`: the positions of each row attention reads, at least the longest row's after
    the step (None: whole rows)."""
    batch, queries = hidden.shape[0], hidden.shape[1]
    cos_sin = body.rotary_emb(hidden, positions)
    cache.attend = cache.max_length if attend is None else attend
    mask = cache.mask(batch, queries)
    kept = None
    config = body.config
    usual, config._attn_implementation = config._attn_implementation, ROWS_ATTENTION
    try:
        for index, layer in enumerate(body.layers):
            if index == keep_input_of:
                kept = hidden
            hidden = layer_call(layer, hidden, mask, cache, cos_sin)
    finally:  # prefill (and everything else) keeps the model's own attention
        config._attn_implementation = usual
        cache.attend = cache.max_length
    normed: torch.Tensor = body.norm(hidden)
    if keep_input_of is not None and keep_input_of >= len(body.layers):
        kept = normed
    return normed, kept


class SlotDecoder:
    def __init__(
        self,
        body: nn.Module,
        *,
        rows: int,
        max_length: int,
        keep_input_of: int | None = None,
        capture: bool | None = None,
        shortest: int = SHORTEST,
        name: str = "decode",
    ) -> None:
        """`shortest`: the shortest length bucket a step attends over (row_lengths.py);
        `max_length` or more: whole rows, one graph per batch size. `name`: whose steps
        these are (the Thinker's, the Talker's), for the log."""
        config: Any = body.config
        parameter = next(body.parameters())
        device, dtype = parameter.device, parameter.dtype
        size = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        self.body = body
        self.keep_input_of = keep_input_of
        self.cache = SlotCache(
            layers=len(body.layers),  # type: ignore[arg-type]
            rows=rows,
            kv_heads=int(config.num_key_value_heads),
            max_length=max_length,
            head_dim=int(getattr(config, "head_dim", None) or size // heads),
            dtype=dtype,
            device=device,
        )
        self.embeds = torch.zeros(rows, 1, size, dtype=dtype, device=device)
        self.positions = torch.zeros(3, rows, 1, dtype=torch.long, device=device)
        self.graphs: LengthGraphs[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = LengthGraphs(
            self._step,
            largest=rows,
            lengths=length_buckets(max_length, min(shortest, max_length)),
            device=device,
            capture=capture,
            name=name,
        )
        self.device = device

    def _step(self, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.embeds[:batch]
        last, kept = run_layers(
            self.body,
            hidden,
            self.positions[:, :batch],
            self.cache,
            keep_input_of=self.keep_input_of,
            attend=length,
        )
        kept = hidden if kept is None else kept
        return hidden[:, -1], kept[:, -1], last[:, -1]

    def step(
        self,
        owners: list[Any],
        embeds: torch.Tensor,
        positions: list[int],
        *,
        whole_rows: bool = False,
    ) -> StepRows:
        """One step for `owners` (each holding a row): `embeds` [n, size] their inputs,
        `positions` their (text) rotary positions. `whole_rows`: attend over every position
        of the rows, as before length buckets (the reference they are tested and measured
        against)."""
        held = [self.cache.row_of(o) for o in owners]
        length = self.graphs.length(self.cache.longest(held))  # refuses a row past its end
        if whole_rows:
            length = self.cache.max_length
        rows = torch.tensor(held, device=self.device)
        where = torch.tensor(positions, device=self.device)
        self.embeds[:, 0].index_copy_(0, rows, embeds.to(self.embeds.dtype))
        self.positions[:, :, 0].index_copy_(1, rows, where.view(1, -1).expand(3, -1))
        first, kept, last = self.graphs.run(self.cache.in_use, length)
        # only the stepped rows moved on: a spare row in the batch rewrites its next position
        self.cache.advance(held, rows)
        return StepRows(first[rows], kept[rows], last[rows])
