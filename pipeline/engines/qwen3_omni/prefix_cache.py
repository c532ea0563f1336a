"""Thinker KV kept between turns: a new turn prefills only what its prompt adds.

A conversation's prompt grows turn by turn: the system item and the earlier history come
back unchanged in front of every new turn. The Thinker keeps the KV (and the per-position
hidden states the Talker needs) of recent prompts' text prefix, and a new prompt that starts
with the same tokens takes that KV and prefills only the rest, with the same positions, so its
output is what a full prefill would give.

What is kept is each prompt's text, up to its first audio or image placeholder: placeholder
ids are the same for any audio or picture, so a match must stop there. The history reaches
the Thinker as text, so the last exchange (spoken, then answered) is re-read as text while
everything before it is reused. The cache needs no session id: a prompt matches whichever
entry shares its longest prefix, and a truncated turn matches only up to where it changed.
It is bounded by `budget_tokens`, least recently used out first; an entry not reused is
simply evicted (that is how an ended session's KV goes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from transformers import DynamicCache

from ..token_lru import TokenLRU, common_prefix
from .batch_cache import crop_copy


@dataclass(frozen=True, slots=True)
class PrefixEntry:
    tokens: tuple[int, ...]
    cache: DynamicCache
    hidden: npt.NDArray[np.floating]
    """[len(tokens), 2, hidden]: what the prefill's positions handed the Talker"""


@dataclass(frozen=True, slots=True)
class PrefixHit:
    length: int
    cache: DynamicCache
    """a private copy, cropped to `length`"""
    hidden: npt.NDArray[np.floating]


class PrefixCache:
    def __init__(self, budget_tokens: int, min_tokens: int = 8) -> None:
        self.budget_tokens = budget_tokens
        self.min_tokens = min_tokens
        self._entries: TokenLRU[tuple[int, ...], PrefixEntry] = TokenLRU(budget_tokens)

    @property
    def tokens(self) -> int:
        """Tokens of KV held now (never more than `budget_tokens`)."""
        return self._entries.tokens

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int]) -> PrefixHit | None:
        """The longest cached prefix of `tokens` (at least `min_tokens`), copied."""
        best: PrefixEntry | None = None
        best_length = 0
        for _, entry in self._entries.items():
            length = common_prefix(entry.tokens, tokens)
            if length > best_length:
                best, best_length = entry, length
        if best is None or best_length < self.min_tokens:
            return None
        self._entries.touch(best.tokens)
        return PrefixHit(
            best_length, crop_copy(best.cache, best_length), best.hidden[:best_length].copy()
        )

    def store(
        self, tokens: Sequence[int], cache: DynamicCache, hidden: npt.NDArray[np.floating]
    ) -> None:
        """Keep a copy of the first len(tokens) positions of `cache` (and their hidden states)."""
        key = tuple(tokens)
        if len(key) < self.min_tokens or len(key) > self.budget_tokens:
            return
        if key in self._entries:
            self._entries.touch(key)
            return
        for other in [k for k, _ in self._entries.items()]:
            if key[: len(other)] == other:  # a longer version of an entry replaces it
                self._entries.pop(other)
        entry = PrefixEntry(key, crop_copy(cache, len(key)), hidden[: len(key)].copy())
        self._entries.put(key, entry, len(key))

    def clear(self) -> None:
        self._entries.clear()
