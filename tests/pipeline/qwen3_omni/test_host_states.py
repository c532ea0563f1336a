"""A bfloat16 Thinker's hidden states cross to the Talker as their bit patterns: exactly the
values the model computed, in half the bytes of float32 (the Talker's prompt is the whole
conversation's user items, sent every turn). A float32 model's go as float32, as before.
Only the positions the Talker reads cross: it builds the same prompt from them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.config import TOKENS
from pipeline.engines.qwen3_omni.host_states import as_float, for_the_talker, to_device, to_host
from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.talker_runner import TalkerPrompt, TalkerRunner
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner
from pipeline.engines.qwen3_omni.weights import build_part

from .conftest import open_talker, text_prompt


def test_bfloat16_travels_as_its_bits_and_comes_back_exactly() -> None:
    values = torch.randn(64, 2, 96).mul(300).to(torch.bfloat16)
    values[0, 0, :4] = torch.tensor([1e-30, -7e4, 3e38, 0.0])  # past float16's range
    host = to_host(values)
    assert host.dtype == np.uint16 and host.nbytes == values.numel() * 2
    assert torch.equal(to_device(host, torch.bfloat16, "cpu"), values)
    assert np.array_equal(as_float(host), values.float().numpy())
    plain = torch.randn(3, 2, 8)
    assert to_host(plain).dtype == np.float32
    assert torch.equal(to_device(to_host(plain), torch.float32, "cpu"), plain)


def test_a_bfloat16_thinker_gives_the_talker_the_same_prompt_and_codes() -> None:
    """The tiny model in bfloat16: the prompt's states are bits, half float32's bytes, and
    the Talker reads from them exactly what the float32 upcast of the same states gives."""
    thinker_model, thinker_config = build_part("thinker", tiny=True, dtype=torch.bfloat16)
    talker_model, talker_config = build_part("talker", tiny=True, dtype=torch.bfloat16)
    thinker = ThinkerRunner(thinker_model, thinker_config)
    talker = TalkerRunner(talker_model, talker_config, min_frames=4)
    _, said = thinker.prefill(text_prompt("Be brief."))
    assert said.states.dtype == np.uint16
    upcast = as_float(said.states)
    assert said.states.nbytes * 2 == upcast.nbytes
    assert torch.equal(talker._tensor(said.states), talker._tensor(upcast))  # noqa: SLF001
    state = open_talker(thinker, talker, text_prompt("Be brief."), reply_tokens=2)
    codes = talker.predict(state)
    assert codes is not None and len(codes) > 0
    talker.release(state)


def test_only_the_positions_the_talker_reads_cross_and_it_hears_the_same_prompt(
    tiny_parts: dict[str, tuple[Any, Qwen3OmniMoeConfig]],
) -> None:
    """A conversation's prompt (system, a user item, the reply to it, this turn): the system
    item and the earlier reply stay behind; the Talker's prompt embeddings, positions and
    first hidden state are the same as from every position."""
    thinker = ThinkerRunner(*tiny_parts["thinker"])
    talker = TalkerRunner(*tiny_parts["talker"], min_frames=4)
    history = [("user", "what is the capital of france"), ("assistant", "paris, " * 12)]
    ids = chat_prompt(
        ByteVocab(), instructions="Be brief.", history=history, audio_tokens=0, text="and of spain"
    )
    thinking, said = thinker.prefill(ThinkerPrompt(ids))
    kept_ids, kept_states = for_the_talker(said.token_ids, said.states)
    assert len(kept_ids) < len(ids) // 2  # the system item and the reply's 84+ positions
    assert kept_ids[-3:] == ids[-3:] and kept_ids.count(TOKENS["im_start"]) == 3
    tts = thinker.special_embeddings([TOKENS["tts_bos"], TOKENS["tts_eos"], TOKENS["tts_pad"]])
    reply = thinker.step(thinking).states
    heard = []
    for token_ids, states in ((said.token_ids, said.states), (kept_ids, kept_states)):
        state = talker.open(TalkerPrompt(token_ids, states, tts))
        talker.add_reply(state, reply)
        talker.end_text(state)
        talker.prefill(state)
        heard.append(state)
    whole, sent = heard
    assert whole.length == sent.length and whole.rope_delta == sent.rope_delta
    assert whole.last_hidden is not None and sent.last_hidden is not None
    assert torch.equal(whole.last_hidden, sent.last_hidden)
    for state in heard:
        talker.release(state)
    thinker.release(thinking)


def test_a_prompt_with_nothing_to_leave_out_is_sent_as_it_is() -> None:
    ids = chat_prompt(ByteVocab(), instructions="", history=[], audio_tokens=3, text="hi")
    states = np.zeros((len(ids), 2, 4), dtype=np.float32)
    kept_ids, kept_states = for_the_talker(ids, states)
    assert kept_ids is ids and kept_states is states
