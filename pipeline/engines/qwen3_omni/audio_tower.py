"""The audio tower as the model was made to run: attention within windows, a window at a time.

Qwen3-Omni's audio encoder (transformers' `Qwen3OmniMoeAudioEncoder`) reads log-mel frames
in conv chunks of `2 * n_window` frames (100: one second), each downsampled on its own to
13 positions with positions of its own, and its layers attend within windows of
`n_window_infer` frames (800: eight seconds, 104 positions), the last window whatever is
left. Under flash attention transformers passes the windows (`cu_seqlens`) to the kernel;
under sdpa and eager (Parley's) 4.57 leaves its own window mask out
(`_prepare_attention_mask` is never called; transformers 5 splits the windows itself), so
an audio over one window attends across all of it, and its first window's features would
change with every later second. `windowed`
puts the mask back, as the model's flash path and its training have it: with it, a finished
window's features are final, which is what lets a turn's audio be encoded while it arrives
(`streamed_turns.py`). An audio of one window (8 s or less) is computed exactly as before.

`encode_rest` encodes the frames after some finished windows: the last window of the
turn, as the whole audio's encoding computes it. Alone, a rest shorter than a conv chunk
would be padded to its own length, where the whole audio pads its last chunk to a full one
(the padding leaks into the last positions through the convolutions); a full chunk of
silence, encoded beside it as an audio of its own, pads it the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .audio_features import audio_token_count


def window_frames(model: Any) -> tuple[int, int]:
    """The Thinker's audio tower's conv chunk and attention window, in log-mel frames."""
    config = model.audio_tower.config
    return 2 * int(config.n_window), int(config.n_window_infer)


@contextmanager
def windowed(model: Any) -> Iterator[None]:
    """Within the block, the Thinker's audio tower attends within its windows (see above).
    transformers 5 attends a window at a time itself under every attention (its layers
    split by `cu_seqlens`) and has no `_prepare_attention_mask`: there this does nothing, as
    a mask passed beside its own `attention_mask=None` would be an error (it was, on the
    GPU host's 5.17: every turn over 8 s failed)."""
    tower = model.audio_tower
    if not hasattr(tower, "_prepare_attention_mask"):
        yield
        return
    masks: dict[int, torch.Tensor | None] = {}

    def with_mask(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        hidden, cu_seqlens = args[0], args[1] if len(args) > 1 else kwargs["cu_seqlens"]
        if len(cu_seqlens) <= 2 or kwargs.get("attention_mask") is not None:
            return None  # one window: attending to all of it is attending within it
        key = id(cu_seqlens)
        if key not in masks:
            masks.clear()
            masks[key] = tower._prepare_attention_mask(hidden, cu_seqlens)
        return args, {**kwargs, "attention_mask": masks[key]}

    handles = [
        layer.register_forward_pre_hook(with_mask, with_kwargs=True) for layer in tower.layers
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.inference_mode()
def encode_rest(model: Any, features: torch.Tensor, *, padded: bool) -> torch.Tensor:
    """The audio tower's positions for `features` ([1, mel_bins, frames]: the frames after
    some finished windows), as the whole audio's encoding gives them; `padded`: the whole
    audio has a full conv chunk, so it pads its last chunk to a full one."""
    chunk, _ = window_frames(model)
    dtype, device = model.dtype, next(model.parameters()).device
    frames = int(features.shape[2])
    flat = features[0].to(device, dtype)
    lengths = [frames]
    silence = 0
    if padded and frames < chunk:
        silence = audio_token_count(chunk)
        flat = torch.cat((torch.zeros(flat.shape[0], chunk, dtype=dtype, device=device), flat), 1)
        lengths = [chunk, frames]
    with windowed(model):
        out = model.audio_tower(flat, feature_lens=torch.tensor(lengths, device=device))
    encoded: torch.Tensor = out.last_hidden_state[silence:]
    return encoded
