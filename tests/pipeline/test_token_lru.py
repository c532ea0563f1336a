"""The token-budget LRU under the Thinker's prefix cache and session KV store."""

from __future__ import annotations

import pytest

from pipeline.engines.token_lru import TokenLRU


def test_least_recently_used_goes_first_and_the_budget_holds() -> None:
    lru: TokenLRU[str, str] = TokenLRU(10)
    assert lru.put("a", "A", 4) == 0 and lru.put("b", "B", 4) == 0
    lru.touch("a")  # b is now the oldest
    assert lru.put("c", "C", 4) == 1
    assert "b" not in lru and lru.get("a") == "A" and lru.tokens == 8
    assert lru.put("a", "A2", 7) == 1  # replacing costs the new size; c went
    assert [k for k, _ in lru.items()] == ["a"] and lru.tokens == 7
    assert lru.pop("a") == "A2" and lru.pop("a") is None and lru.tokens == 0
    with pytest.raises(ValueError, match="budget_tokens"):
        TokenLRU(0)
