"""Thinker KV kept between turns: the next turn prefills only what it adds, and answers as a
full prefill of the same conversation would."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.audio_features import AudioFeatures
from pipeline.engines.qwen3_omni.config import TOKENS
from pipeline.engines.qwen3_omni.prefix_cache import PrefixCache
from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner

from .conftest import turn_audio

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]
INSTRUCTIONS = "You are a helpful voice assistant. Keep it short."


def turn_prompt(history: list[tuple[str, str]], seed: int) -> ThinkerPrompt:
    audio = AudioFeatures()(turn_audio(1.0, seed=seed))
    assert audio is not None
    ids = chat_prompt(
        ByteVocab(),
        instructions=INSTRUCTIONS,
        history=history,
        audio_tokens=audio.tokens,
        text=None,
    )
    return ThinkerPrompt(ids, audio)


def test_a_second_turn_prefills_only_its_new_tokens_and_matches_a_full_prefill(
    tiny_parts: Parts,
) -> None:
    model, config = tiny_parts["thinker"]
    cached = ThinkerRunner(model, config, prefix_cache=PrefixCache(budget_tokens=4096))
    plain = ThinkerRunner(model, config)
    first = turn_prompt([("user", "hello"), ("assistant", "hi there")], seed=1)
    cached.prefill(first)
    assert cached.last_prefill_tokens == len(first.input_ids)  # nothing to reuse yet

    history = [("user", "hello"), ("assistant", "hi there"), ("user", ""), ("assistant", "ok")]
    second = turn_prompt(history, seed=2)
    reused_state, reused = cached.prefill(second)
    full_state, full = plain.prefill(second)
    # reused: the text both prompts start with (up to the first turn's audio)
    shared = 0
    while first.input_ids[shared] == second.input_ids[shared] != TOKENS["audio_start"]:
        shared += 1
    assert shared > 40  # the instructions and the first exchange
    assert cached.last_prefill_tokens == len(second.input_ids) - shared
    np.testing.assert_allclose(reused.states, full.states, atol=1e-5)
    for _ in range(4):
        np.testing.assert_allclose(
            cached.step(reused_state).states, plain.step(full_state).states, atol=1e-5
        )
    assert reused_state.generated == full_state.generated


def test_a_conversation_over_the_budget_is_evicted_least_recent_first() -> None:
    def cache_of(length: int) -> DynamicCache:
        cache = DynamicCache()
        cache.update(torch.ones(1, 2, length, 4), torch.ones(1, 2, length, 4), 0)
        return cache

    prefixes = PrefixCache(budget_tokens=100, min_tokens=4)
    hidden = np.zeros((60, 2, 4), dtype=np.float32)
    a, b, c = list(range(40)), [7] * 40, [9] * 40
    prefixes.store(a, cache_of(40), hidden)
    prefixes.store(b, cache_of(40), hidden)
    hit = prefixes.lookup(a + [1, 2, 3])
    assert hit is not None and hit.length == 40 and hit.cache.get_seq_length() == 40
    prefixes.store(c, cache_of(40), hidden)  # over budget: b, the least recently used, goes
    assert len(prefixes) == 2 and prefixes.tokens == 80
    assert prefixes.lookup(b) is None
    assert prefixes.lookup(c[:10]) is not None
    prefixes.store(a + [5] * 20, cache_of(60), hidden)  # a grown conversation replaces its head
    assert len(prefixes) == 2 and prefixes.tokens == 100
    prefixes.clear()
    assert len(prefixes) == 0 and prefixes.tokens == 0
