"""The Thinker's kept KV: the longest shared prefix is found, taken over or copied, bounded."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from pipeline.engines.cascade.prefix_cache import MIN_REUSE, PrefixCache


def kv_of(ids: list[int]) -> DynamicCache:
    """A one-layer cache whose keys at each position hold that position's token id."""
    cache = DynamicCache()
    keys = torch.tensor(ids, dtype=torch.float32).reshape(1, 1, -1, 1)
    cache.update(keys, keys.clone(), 0)
    return cache


def held(cache: DynamicCache) -> list[int]:
    keys = cache.layers[0].keys
    assert keys is not None
    return [int(v) for v in keys.reshape(-1).tolist()]


def test_an_unknown_prompt_starts_from_an_empty_cache() -> None:
    prefixes = PrefixCache()
    prefixes.put(list(range(100, 120)), kv_of(list(range(100, 120))))
    cache = prefixes.take(list(range(20)))
    assert cache.get_seq_length() == 0 and prefixes.reused_tokens == 0
    assert len(prefixes) == 1


def test_the_next_turn_takes_over_the_conversation_so_far() -> None:
    prefixes = PrefixCache()
    turn = list(range(30))
    prefixes.put(turn, kv_of(turn))
    cache = prefixes.take([*turn, 70, 71, 72])
    assert held(cache) == turn and prefixes.reused_tokens == 30
    assert len(prefixes) == 0  # taken over: the conversation moved on


def test_a_shared_start_is_copied_and_the_entry_stays() -> None:
    prefixes = PrefixCache()
    first = [*range(20), 50, 51, 52]
    prefixes.put(first, kv_of(first))
    cache = prefixes.take([*range(20), 60, 61])
    assert held(cache) == list(range(20)) and prefixes.reused_tokens == 20
    assert len(prefixes) == 1
    again = prefixes.take([*first, 99])
    assert held(again) == first  # the copy was cropped, never the entry


def test_the_whole_prompt_is_never_reused_the_last_token_runs_again() -> None:
    prefixes = PrefixCache()
    prompt = list(range(40))
    prefixes.put(prompt, kv_of(prompt))
    cache = prefixes.take(prompt)
    assert cache.get_seq_length() == 39


def test_the_longest_match_wins_and_short_matches_are_ignored() -> None:
    prefixes = PrefixCache()
    short = [*range(MIN_REUSE - 1), 500]
    longer = [*range(25), 600]
    prefixes.put(short, kv_of(short))
    prefixes.put(longer, kv_of(longer))
    assert held(prefixes.take([*range(30)])) == list(range(25))
    fresh = PrefixCache()
    fresh.put(short, kv_of(short))
    assert fresh.take([*range(30)]).get_seq_length() == 0


def test_a_newer_entry_replaces_the_ones_it_extends() -> None:
    prefixes = PrefixCache()
    prefixes.put(list(range(10)), kv_of(list(range(10))))
    prefixes.put(list(range(20)), kv_of(list(range(20))))
    assert len(prefixes) == 1 and prefixes.tokens == 20


def test_the_cache_holds_at_most_its_token_budget_oldest_out_first() -> None:
    prefixes = PrefixCache(max_tokens=50)
    for start in (1000, 2000, 3000):
        ids = list(range(start, start + 20))
        prefixes.put(ids, kv_of(ids))
    assert prefixes.tokens <= 50 and len(prefixes) == 2
    assert prefixes.take(list(range(1000, 1030))).get_seq_length() == 0
    assert prefixes.take(list(range(3000, 3030))).get_seq_length() == 20
    prefixes.put(list(range(60)), kv_of(list(range(60))))  # larger than the budget: not kept
    assert prefixes.tokens <= 50


def test_forgetting_drops_every_entry_by_the_next_take() -> None:
    prefixes = PrefixCache()
    ids = list(range(30))
    prefixes.put(ids, kv_of(ids))
    prefixes.forget()
    prefixes.put([*ids, 31], kv_of([*ids, 31]))  # a generation that ended meanwhile
    assert prefixes.take([*ids, 31, 32]).get_seq_length() == 0 and len(prefixes) == 0
