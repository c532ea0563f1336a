"""Entries that each cost some tokens of KV, kept under a token budget, least recently used
out first: what the Thinkers' prefix caches (Qwen3-Omni's and the cascade's) and Qwen3-Omni's
per-session KV store have in common; and how long a prefix two prompts share."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

KeyT = TypeVar("KeyT")
ValueT = TypeVar("ValueT")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TokenLRU(Generic[KeyT, ValueT]):
    def __init__(self, budget_tokens: int) -> None:
        if budget_tokens < 1:
            raise ValueError("budget_tokens must be at least 1")
        self.budget_tokens = budget_tokens
        self._entries: OrderedDict[KeyT, tuple[ValueT, int]] = OrderedDict()
        self._tokens = 0

    @property
    def tokens(self) -> int:
        """Tokens held now (never more than `budget_tokens` after a `put`)."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def items(self) -> Iterator[tuple[KeyT, ValueT]]:
        """Least recently used first."""
        return ((key, value) for key, (value, _) in self._entries.items())

    def get(self, key: KeyT) -> ValueT | None:
        """The entry, left where it is in the order."""
        held = self._entries.get(key)
        return held[0] if held is not None else None

    def touch(self, key: KeyT) -> None:
        """`key` was just used: it goes out last."""
        self._entries.move_to_end(key)

    def pop(self, key: KeyT) -> ValueT | None:
        held = self._entries.pop(key, None)
        if held is None:
            return None
        self._tokens -= held[1]
        return held[0]

    def put(self, key: KeyT, value: ValueT, tokens: int) -> int:
        """Keep `value` under `key` (replacing any), then drop the least recently used
        entries until the budget holds; returns how many were dropped."""
        self.pop(key)
        self._entries[key] = (value, tokens)
        self._tokens += tokens
        dropped = 0
        while self._tokens > self.budget_tokens:
            self.pop(next(iter(self._entries)))
            dropped += 1
        return dropped

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
