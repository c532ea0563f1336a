"""The Thinker's decode steps on cache rows: batched without copies, captured on a GPU.

A request's prefill builds its own DynamicCache (prompts differ in length and media); at its
first decode step the cache is copied once into a row of a `SlotDecoder`, and from then on
every step of every request in flight is one forward over the rows in use. When the request
ends its row is given back, and its cache copied out first if the session keeps it for its
next turn. The engine's row gate (`row_gate.py`) lets no more requests decode than there are
rows; a request that finds none anyway is stepped the plain way only where the graph file
asks for it (`plain_fallback`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .row_lengths import SHORTEST
from .slot_decoder import SlotDecoder


class ThinkerSlots:
    def __init__(
        self,
        model: Any,
        *,
        rows: int,
        max_length: int,
        accept_layer: int,
        reserve: int,
        capture: bool | None = None,
        shortest: int = SHORTEST,
    ) -> None:
        self.model = model
        self.reserve = reserve
        """Positions a request may still add after its prefill (its reply budget)."""
        self.decoder = SlotDecoder(
            model.model,
            rows=rows,
            max_length=max_length,
            keep_input_of=accept_layer,
            capture=capture,
            shortest=shortest,
            name="thinker",
        )
        self.device = self.decoder.device

    def warm(self) -> None:
        self.decoder.graphs.warm()

    def seat(self, state: Any) -> bool:
        """Whether `state` holds a row (taking one for it if it can; `release` gives its KV
        back)."""
        return self.decoder.cache.seat(state, self.reserve)

    def step(
        self, states: list[Any], choose: Callable[[list[Any], torch.Tensor], list[int]]
    ) -> torch.Tensor:
        """Feed each state's next token; returns [n, 2, hidden] (embedding output and accept
        layer) on the host, and sets the states' next tokens to `choose(states, logits)`."""
        fed = torch.tensor([state.next_token for state in states], device=self.device)
        embeds = self.model.get_input_embeddings()(fed)
        positions = [state.length + state.rope_delta for state in states]
        rows = self.decoder.step(states, embeds, positions)
        logits = self.model.lm_head(rows.last)
        hidden = torch.stack((rows.embeds, rows.kept), dim=1).cpu()  # dtype kept: host_states.py
        for state, token in zip(states, choose(states, logits), strict=True):
            state.length += 1
            state.next_token = token
        return hidden

    def release(self, state: Any, *, keep: bool) -> None:
        """Give `state`'s row back; with `keep`, its cache returns to `state.cache` first."""
        cache = self.decoder.cache
        if not cache.holds(state):
            return
        if keep:
            state.cache = cache.cache_of(state, state.length)
        cache.give_back(state)
