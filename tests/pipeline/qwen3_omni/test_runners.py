"""The runners against transformers' own generate(), and their streaming rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.audio_features import AudioFeatures
from pipeline.engines.qwen3_omni.code2wav_runner import Code2WavRunner, FrameChunker
from pipeline.engines.qwen3_omni.config import FULL_SIZE, TOKENS, omni_config
from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.talker_runner import TalkerPrompt, TalkerRunner
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner
from pipeline.engines.qwen3_omni.vision_input import FrameImages
from pipeline.engines.qwen3_omni.weights import build_part
from pipeline.types import VideoFrame

from .conftest import camera_frame, turn_audio

Parts = dict[str, tuple[Any, Qwen3OmniMoeConfig]]


def spoken_prompt() -> ThinkerPrompt:
    """A spoken turn with two camera frames (and a third that does not decode)."""
    audio = AudioFeatures()(turn_audio(1.5))
    assert audio is not None and audio.tokens > 0
    vision = FrameImages()([camera_frame(0), VideoFrame(b"not a jpeg", 40), camera_frame(80)])
    assert vision is not None and vision.tokens == [80, 80]  # 320x240: 20x16 patches, 2x2
    ids = chat_prompt(
        ByteVocab(),
        instructions="Be brief.",
        history=[("user", "hi"), ("assistant", "hello")],
        audio_tokens=audio.tokens,
        text=None,
        image_tokens=vision.tokens,
    )
    assert ids.count(TOKENS["audio"]) == audio.tokens
    assert ids.count(TOKENS["image"]) == 160
    return ThinkerPrompt(ids, audio, vision)


def test_thinker_steps_match_transformers_generate(tiny_parts: Parts) -> None:
    model, config = tiny_parts["thinker"]
    runner = ThinkerRunner(model, config)
    prompt = spoken_prompt()
    state, prompt_hidden = runner.prefill(prompt)
    fed = [runner.step(state) for _ in range(7)]
    assert prompt_hidden.states.shape == (len(prompt.input_ids), 2, 64)

    assert prompt.audio is not None and prompt.vision is not None
    ids = torch.tensor([prompt.input_ids])
    reference = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        input_features=prompt.audio.features,
        feature_attention_mask=prompt.audio.mask,
        pixel_values=prompt.vision.pixel_values,
        image_grid_thw=prompt.vision.grid_thw,
        max_new_tokens=8,
        do_sample=False,
        output_hidden_states=True,
        return_dict_in_generate=True,
    )
    tokens = reference.sequences[0, len(prompt.input_ids) :].tolist()
    assert [h.token_ids[0] for h in fed] + [state.next_token] == tokens
    accept = config.talker_config.accept_hidden_layer
    for layer, column in ((0, 0), (accept, 1)):
        expected = torch.cat([step[layer][0] for step in reference.hidden_states], dim=0)
        ours = np.concatenate(
            [prompt_hidden.states[:, column]] + [h.states[:, column] for h in fed]
        )
        np.testing.assert_allclose(ours, expected.numpy(), atol=1e-5)


def test_talker_waits_for_text_and_makes_frames_of_16_codes(tiny_parts: Parts) -> None:
    thinker, config = tiny_parts["thinker"]
    talker_model, _ = tiny_parts["talker"]
    thinker_runner = ThinkerRunner(thinker, config)
    state, prompt_hidden = thinker_runner.prefill(spoken_prompt())
    tts = thinker_runner.special_embeddings(
        [TOKENS["tts_bos"], TOKENS["tts_eos"], TOKENS["tts_pad"]]
    )
    talker = TalkerRunner(talker_model, config, min_frames=6)
    grids = ((1, 16, 20), (1, 16, 20))
    talking = talker.open(
        TalkerPrompt(prompt_hidden.token_ids, prompt_hidden.states, tts, (150,), grids)
    )
    assert not talker.can_start(talking)  # needs the first reply token's hidden states
    talker.add_reply(talking, thinker_runner.step(state).states)
    assert talker.can_start(talking)
    talker.prefill(talking)
    codes = talker.predict(talking)
    assert codes is not None and codes.shape == (16,) and codes.dtype == np.int32
    assert not talker.text_ready(talking)  # the next step needs the second reply token
    talker.add_reply(talking, thinker_runner.step(state).states)
    assert talker.text_ready(talking)
    talker.advance(talking, codes)
    talker.end_text(talking)  # from here on: tts_eos, then tts_pad
    frames = [codes]
    while len(frames) < 6:
        assert talker.text_ready(talking)
        next_codes = talker.predict(talking)
        assert next_codes is not None
        frames.append(next_codes)
        talker.advance(talking, next_codes)
    stacked = np.stack(frames)
    assert (stacked >= 0).all() and (stacked[:, 1:] < 2048).all() and (stacked[:, 0] < 2048).all()


def test_chunks_grow_from_the_first_to_the_full_size() -> None:
    """Each chunk at most doubles the one before (playback never waits for a chunk four
    times the length of the one playing), then stays at `chunk`."""
    chunker = FrameChunker(first_chunk=5, chunk=25, left_context=25)
    sizes = []
    for i in range(100):
        if (ready := chunker.push(np.full(16, i, dtype=np.int32))) is not None:
            window, context = ready
            sizes.append(len(window) - context)
    assert sizes == [5, 10, 20, 25, 25]


def test_a_chunker_without_left_context_is_refused() -> None:
    """Without the frame before it, a window cannot make its first samples: each chunk
    boundary would be a 23 ms gap, so the setting is refused, saying why."""
    with pytest.raises(ValueError, match="left_context must be at least 1 frame"):
        FrameChunker(first_chunk=5, chunk=25, left_context=0)


def test_code2wav_chunks_with_left_context(tiny_parts: Parts) -> None:
    chunker = FrameChunker(first_chunk=2, chunk=4, left_context=3)
    windows = []
    for i in range(11):
        if (ready := chunker.push(np.full(16, i, dtype=np.int32))) is not None:
            windows.append(ready)
    if (rest := chunker.flush()) is not None:
        windows.append(rest)
    assert [(w[:, 0].tolist(), ctx) for w, ctx in windows] == [
        ([0, 1], 0),
        ([0, 1, 2, 3, 4, 5], 2),
        ([3, 4, 5, 6, 7, 8, 9], 3),
        ([7, 8, 9, 10], 3),
    ]
    runner = Code2WavRunner(tiny_parts["code2wav"][0])
    audio = [runner.decode(window, context) for window, context in windows]
    per_frame = runner.samples_per_frame
    assert per_frame == 1920  # 80 ms at 24 kHz
    # a window's last 555 samples need the next frame (the decoder looks one step ahead): the
    # next window makes them, so only the first falls short, and the stream is as long as one
    # whole decode of the 11 frames
    new_frames = [len(w) - ctx for w, ctx in windows]
    assert [len(samples) for samples in audio] == [
        frames * per_frame - (555 if i == 0 else 0) for i, frames in enumerate(new_frames)
    ]
    whole = runner.decode(np.stack([np.full(16, i, dtype=np.int32) for i in range(11)]), 0)
    assert sum(len(samples) for samples in audio) == len(whole) == 11 * per_frame - 555


def test_full_size_config_is_the_released_model() -> None:
    config = omni_config(tiny=False)
    text = config.thinker_config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_experts) == (2048, 48, 128)
    assert config.talker_config.accept_hidden_layer == 24
    assert config.talker_config.text_config.num_experts == 128
    assert config.code2wav_config.upsample_rates == FULL_SIZE["code2wav"]["upsample_rates"]


def test_random_weights_are_seeded_and_a_checkpoint_loads(tmp_path: Path) -> None:
    first, config = build_part("code2wav", tiny=True, seed=3)
    again, _ = build_part("code2wav", tiny=True, seed=3)
    other, _ = build_part("code2wav", tiny=True, seed=4)
    weights = first.state_dict()
    assert all(torch.equal(weights[k], v) for k, v in again.state_dict().items())
    assert not all(torch.equal(weights[k], v) for k, v in other.state_dict().items())

    config.save_pretrained(tmp_path)  # the Hugging Face layout: config.json + safetensors
    save_file(
        {f"code2wav.{k}": v.contiguous() for k, v in weights.items()},
        tmp_path / "model.safetensors",
    )
    loaded, loaded_config = build_part("code2wav", model_path=str(tmp_path))
    assert loaded_config.code2wav_config.hidden_size == 64
    assert all(torch.equal(weights[k], v) for k, v in loaded.state_dict().items())

    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(RuntimeError, match=r"no model\.safetensors"):
        build_part("code2wav", model_path=str(tmp_path))


def test_reply_text_waits_on_the_host_and_a_batch_projects_it_in_one_call(
    tiny_parts: Parts,
) -> None:
    """The Thinker's reply hidden states reach the Talker token by token; projecting each as
    it came cost one small model call per token and request between the frame steps. They
    wait on the host (counted at once for `text_ready`) and the next step projects every
    request's in one call, to the same embeddings."""
    thinker_model, config = tiny_parts["thinker"]
    talker_model, _ = tiny_parts["talker"]
    thinker = ThinkerRunner(thinker_model, config)
    tts = thinker.special_embeddings([TOKENS["tts_bos"], TOKENS["tts_eos"], TOKENS["tts_pad"]])
    talker = TalkerRunner(talker_model, config)
    projection = talker_model.text_projection
    calls: list[int] = []
    hook = projection.register_forward_pre_hook(lambda _, args: calls.append(args[0].shape[0]))
    try:
        _project_in_batches(talker, thinker, tts, config, projection, calls)
    finally:
        hook.remove()


def _project_in_batches(
    talker: TalkerRunner,
    thinker: ThinkerRunner,
    tts: npt.NDArray[np.floating],
    config: Qwen3OmniMoeConfig,
    projection: torch.nn.Module,
    calls: list[int],
) -> None:
    fed: list[list[np.ndarray[Any, Any]]] = []
    states = []
    for _ in range(2):
        thinking, said = thinker.prefill(spoken_prompt())
        talking = talker.open(TalkerPrompt(said.token_ids, said.states, tts))
        steps = [thinker.step(thinking).states for _ in range(3)]
        for hidden in steps:
            talker.add_reply(talking, hidden)
        assert talking.received == 3 and talker.can_start(talking) and talker.text_ready(talking)
        fed.append(steps)
        states.append(talking)
    assert not calls  # nothing ran on the model yet
    talker.prefill_batch(states)
    assert calls[0] == 6  # both requests' three reply tokens in one call (then the prompts)
    for talking, steps in zip(states, fed, strict=True):
        with torch.inference_mode():
            expected = projection(torch.from_numpy(np.concatenate([s[:, 0] for s in steps])))
        torch.testing.assert_close(torch.cat(talking.reply), expected)
    calls.clear()
    codes = [talker.predict(s) for s in states]
    for talking in states:
        talker.add_reply(talking, np.zeros((1, 2, config.thinker_config.text_config.hidden_size)))
    talker.advance_batch(states, [c for c in codes if c is not None])
    assert calls == [2] and all(len(s.reply) == 4 and not s.unprojected for s in states)
