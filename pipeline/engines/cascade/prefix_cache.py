"""The Thinker's KV cache kept between requests, reused by any prompt that starts the same way.

On a CPU a prompt costs its prefill: every token of instructions and history is run through
the model again before the first new word (~1.7 ms a token for int8 SmolLM2 here, so a
conversation of 400 tokens waited ~0.7 s each turn). But the next turn of a conversation
starts with the previous turn's prompt and reply, and every session with the default
instructions starts with the same system message. So after each generation the KV it built
is kept with the token ids it holds; a new prompt takes the entry that shares its longest
prefix, and only the rest is prefilled.

No session ids are needed: the match is on tokens, so an edited or truncated history, other
instructions or a discarded speculative turn simply reuse less (down to nothing). An entry
whose tokens are all a prefix of the new prompt is taken over (the conversation moved on and
the old entry would never be better); an entry that matches in part is copied, cropped to
the common prefix, and stays for others.

Bounded: at most `max_tokens` tokens in all (~46 KB each for SmolLM2-135M), least recently
used entries out first. Used only by the model thread, so it has no lock; `forget` may be
called from any thread and takes effect at the next `take`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from transformers import DynamicCache

from ..token_lru import TokenLRU, common_prefix

MIN_REUSE = 8
"""Fewer common tokens than this are not worth a copy."""


class PrefixCache:
    def __init__(self, max_tokens: int = 2048) -> None:
        self._entries: TokenLRU[tuple[int, ...], DynamicCache] = TokenLRU(max_tokens)
        self._forgotten = False
        self.reused_tokens = 0
        """How many prompt tokens the last `take` found cached (for tests and benchmarks)."""

    @property
    def tokens(self) -> int:
        return self._entries.tokens

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, ids: Sequence[int]) -> DynamicCache:
        """A cache to generate `ids` from: holding their longest cached prefix (never all of
        them: the model must run at least the last token to predict the next), or empty."""
        if self._forgotten:
            self._forgotten = False
            self._entries.clear()
        best_key, best = None, 0
        for key, _ in self._entries.items():
            shared = min(common_prefix(key, ids), len(ids) - 1)
            if shared > best:
                best_key, best = key, shared
        self.reused_tokens = 0
        if best_key is None or best < MIN_REUSE:
            return DynamicCache()
        if best == len(best_key):  # the conversation moved on: take the entry over
            cache = self._entries.pop(best_key)
        else:
            self._entries.touch(best_key)
            cache = copy.deepcopy(self._entries.get(best_key))
        assert cache is not None
        cache.crop(best)
        self.reused_tokens = best
        return cache

    def put(self, ids: Sequence[int], cache: DynamicCache) -> None:
        """Keep `cache`, which holds the KV of exactly `ids`."""
        kept = tuple(ids)
        if not kept or len(kept) > self._entries.budget_tokens:
            return
        for key, _ in list(self._entries.items()):
            if common_prefix(key, kept) == len(key):
                self._entries.pop(key)  # a prefix of the new one: never the better match
        self._entries.put(kept, cache, len(kept))

    def forget(self) -> None:
        """Drop every entry, as of the next `take` (so the next prompt prefills in full)."""
        self._forgotten = True
