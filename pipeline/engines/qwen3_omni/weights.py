"""Build one stage's model: a real checkpoint's weights when there is one, random otherwise.

Each stage process holds only its own part of the model (the thinker, the talker with its code
predictor, or code2wav), never the whole 35 B parameters. A checkpoint in the Hugging Face
layout (`config.json` plus `*.safetensors`, keys prefixed `thinker.`, `talker.`, `code2wav.`)
is read shard by shard, and only the shards holding that part are opened.

Random weights are seeded per part, so two processes building the same part get the same
model, and tests are deterministic. transformers' random init leaves two talker tensors
alone (its MoE experts are left as uninitialised memory and its router is zeros, so every
token would tie and go to the first experts); they get the same N(0, 0.02) as the rest.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling

from .config import omni_config

Part = Literal["thinker", "talker", "code2wav"]
PART_SEED_OFFSET: dict[Part, int] = {"thinker": 0, "talker": 1, "code2wav": 2}

try:
    from transformers.modeling_utils import no_init_weights as _no_init_weights
except ImportError:  # pragma: no cover - a transformers without it: init, then overwrite
    _no_init_weights = contextlib.nullcontext  # type: ignore[assignment]


class CheckpointError(RuntimeError):
    pass


def load_config(model_path: str | None, tiny: bool) -> Qwen3OmniMoeConfig:
    config = Qwen3OmniMoeConfig.from_pretrained(model_path) if model_path else omni_config(tiny)
    if not hasattr(config.talker_config, "audio_config"):
        # transformers 5.x's talker reads `audio_config.n_window` to place the audio of its
        # prompt (get_rope_index), but its config class carries none: lend it the thinker's.
        config.talker_config.audio_config = config.thinker_config.audio_config
    return config


def _part_class(part: Part) -> type[nn.Module]:
    classes: dict[Part, type[nn.Module]] = {
        "thinker": modeling.Qwen3OmniMoeThinkerForConditionalGeneration,
        "talker": modeling.Qwen3OmniMoeTalkerForConditionalGeneration,
        "code2wav": modeling.Qwen3OmniMoeCode2Wav,
    }
    return classes[part]


def _part_config(config: Qwen3OmniMoeConfig, part: Part) -> object:
    return getattr(config, f"{part}_config")


def build_part(
    part: Part,
    *,
    model_path: str | None = None,
    tiny: bool = True,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    attn_implementation: str = "sdpa",
) -> tuple[Any, Qwen3OmniMoeConfig]:
    """The part's module (untyped, as transformers' are; eval mode, on `device`) and the config."""
    config = load_config(model_path, tiny)
    cls = _part_class(part)
    sub = _part_config(config, part)
    if model_path:
        with _no_init_weights(), torch.device(device):
            module = cls._from_config(sub, dtype=dtype, attn_implementation=attn_implementation)  # type: ignore[attr-defined]
        _load_checkpoint(module, Path(model_path), part)
    else:
        torch.manual_seed(seed + PART_SEED_OFFSET[part])
        with torch.device(device):
            module = cls._from_config(sub, dtype=dtype, attn_implementation=attn_implementation)  # type: ignore[attr-defined]
        _fix_uninitialised(module, seed + PART_SEED_OFFSET[part])
    module.eval()
    module.requires_grad_(False)
    return module, config


def meta_part(
    part: Part, *, model_path: str | None = None, tiny: bool = True, dtype: torch.dtype
) -> Any:
    """The part's module on the meta device: its shapes and dtypes, no memory (sizing counts
    the weights of a neighbour stage that shares the GPU from it: memory.py)."""
    config = load_config(model_path, tiny)
    with _no_init_weights(), torch.device("meta"):
        return _part_class(part)._from_config(_part_config(config, part), dtype=dtype)  # type: ignore[attr-defined]


def _fix_uninitialised(module: nn.Module, seed: int) -> None:
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for sub in module.modules():
            kind = type(sub).__name__
            if kind == "Qwen3OmniMoeTalkerTextExperts":
                tensors = [sub.gate_up_proj, sub.down_proj]
            elif kind == "Qwen3OmniMoeTalkerTextTopKRouter":
                tensors = [sub.weight]
            else:
                continue
            for tensor in tensors:
                assert isinstance(tensor, torch.Tensor)
                device = tensor.device  # drawn where the tensor lives: no host copy of GBs
                if device not in generators:
                    generators[device] = torch.Generator(device=device).manual_seed(seed + 1000)
                draw = torch.randn(
                    tensor.shape, generator=generators[device], device=device, dtype=tensor.dtype
                )
                tensor.copy_(draw * 0.02)
        bad = [name for name, p in module.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise CheckpointError(f"random init left non-finite parameters: {', '.join(bad[:5])}")


def _shards(root: Path, prefix: str) -> Iterator[Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        names = sorted({f for key, f in weight_map.items() if key.startswith(prefix)})
        yield from (root / name for name in names)
    elif (root / "model.safetensors").is_file():
        yield root / "model.safetensors"
    else:
        raise CheckpointError(f"{root}: no model.safetensors(.index.json)")


def _load_checkpoint(module: nn.Module, root: Path, part: Part) -> None:
    from safetensors import safe_open

    prefix = f"{part}."
    expected = dict(module.state_dict())
    seen: set[str] = set()
    with torch.no_grad():
        for shard in _shards(root, prefix):
            with safe_open(str(shard), framework="pt") as tensors:
                for key in tensors.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if not key.startswith(prefix):
                        continue
                    name = key[len(prefix) :]
                    if name not in expected:
                        continue  # e.g. a tied head stored twice
                    target = expected[name]
                    target.copy_(tensors.get_tensor(key).to(target.dtype))
                    seen.add(name)
    # buffers that are computed, not stored (rotary inv_freq, code offsets) keep their values
    persistent = {name for name, _ in module.named_parameters()}
    missing = sorted(persistent - seen)
    if missing:
        raise CheckpointError(
            f"{root}: {len(missing)} {part} weights missing, e.g. {', '.join(missing[:3])}"
        )
