"""The audio tower attends within its 8 s windows, so a finished window's features are final,
and the frames after some finished windows encode as the whole audio encodes them."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.engines.qwen3_omni.audio_features import AudioFeatures
from pipeline.engines.qwen3_omni.audio_tower import encode_rest, window_frames, windowed

from .conftest import turn_audio
from .reference import Parts

ROUNDING = 1e-6
"""The tower's outputs (~2e-2 on the tiny model) computed in other shapes: float rounding."""


def mel(seconds: float, seed: int, *, changed_after: float | None = None) -> torch.Tensor:
    audio = turn_audio(seconds, seed=seed)
    if changed_after is not None:
        cut = int(16_000 * changed_after)
        audio[cut:] = turn_audio(seconds, seed=seed + 100)[cut:]
    features = AudioFeatures()(audio)
    assert features is not None
    return features.features


def whole(model: Any, features: torch.Tensor) -> torch.Tensor:
    """The Thinker's own encoding of one audio, within windows."""
    mask = torch.ones(1, features.shape[2], dtype=torch.long)
    with torch.inference_mode(), windowed(model):
        encoded: torch.Tensor = model.get_audio_features(features, feature_attention_mask=mask)
    return encoded


def test_the_windows_are_the_models(tiny_parts: Parts) -> None:
    model = tiny_parts["thinker"][0]
    assert window_frames(model) == (100, 800)


def test_a_finished_window_does_not_change_with_the_audio_after_it(tiny_parts: Parts) -> None:
    """Two 10 s audios that differ only after 8.1 s: their first windows' features are
    the same, bit for bit (transformers' sdpa path alone attends across windows)."""
    model = tiny_parts["thinker"][0]
    one, other = mel(10.0, 1), mel(10.0, 1, changed_after=8.1)
    assert torch.equal(one[:, :, :800], other[:, :, :800])
    first, second = whole(model, one), whole(model, other)
    assert torch.equal(first[:104], second[:104])
    assert not torch.equal(first[104:], second[104:])


def test_the_rest_after_a_window_encodes_as_in_the_whole_audio(tiny_parts: Parts) -> None:
    """The first window alone and the rest after it (0.3 s: one partial conv chunk, padded
    as the whole audio pads it; 2.5 s: chunks and a partial one) are the whole audio's."""
    model = tiny_parts["thinker"][0]
    for seconds in (8.3, 10.5):
        features = mel(seconds, 2)
        want = whole(model, features)
        first = whole(model, features[:, :, :800])
        rest = encode_rest(model, features[:, :, 800:], padded=True)
        torch.testing.assert_close(torch.cat((first, rest)), want, atol=ROUNDING, rtol=0)
    unpadded = encode_rest(model, mel(8.3, 2)[:, :, 800:], padded=False)
    assert not torch.allclose(unpadded, whole(model, mel(8.3, 2))[104:], atol=ROUNDING, rtol=0)


def test_a_tower_that_windows_itself_is_left_alone() -> None:
    """transformers 5's tower splits its windows itself and has no `_prepare_attention_mask`
    (the GPU host's 5.17): `windowed` adds nothing there (a mask beside its own
    `attention_mask=None` failed every turn over 8 s)."""

    class Layer(torch.nn.Module):
        def forward(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
            return hidden

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

    class Model:
        audio_tower = Tower()

    with windowed(Model()):
        assert all(not layer._forward_pre_hooks for layer in Model.audio_tower.layers)
