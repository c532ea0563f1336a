"""A bfloat16 Thinker's hidden states cross to the Talker as their bit patterns: exactly the
values the model computed, in half the bytes of float32 (the Talker's prompt is the whole
conversation's user items, sent every turn). A float32 model's go as float32, as before."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.engines.qwen3_omni.host_states import as_float, to_device, to_host
from pipeline.engines.qwen3_omni.talker_runner import TalkerRunner
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerRunner
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
