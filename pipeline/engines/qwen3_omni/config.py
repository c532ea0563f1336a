"""Qwen3-Omni-30B-A3B's architecture as a transformers config, at full size or tiny.

The config classes' own defaults are not the released model (they are partly Qwen2.5-Omni-7B),
so the released dimensions live here, as the checkpoint's config.json states them; `tiny`
shrinks widths and depths but keeps every structural choice (MoE routing, mRoPE sections, 16
codebooks, the code2wav upsampling chain) and the special token ids, so the same runners drive
both. A real checkpoint's own config.json wins when a model path is given (see `weights.py`).

Two transformers generations read these configs differently: 4.x wants `rope_scaling` plus
`rope_theta`, 5.x `rope_parameters`; both are given. Some fields the modelling code reads are
not declared on the config classes (the talker's `spatial_merge_size`, the thinker's
`vision_start_token_id`, ...); they are passed explicitly as the real config.json does.
"""

from __future__ import annotations

import copy
from typing import Any

from transformers import Qwen3OmniMoeConfig

from .rope_warning import drop_mrope_keys_warning

drop_mrope_keys_warning()  # transformers 5.x warns about keys the Talker uses (see there)

TOKENS = {
    "im_start": 151644,
    "im_end": 151645,
    "system": 8948,
    "user": 872,
    "assistant": 77091,
    "newline": 198,
    "tts_pad": 151671,
    "tts_bos": 151672,
    "tts_eos": 151673,
    "audio": 151675,
    "audio_start": 151669,
    "audio_end": 151670,
    "image": 151655,
    "video": 151656,
    "vision_start": 151652,
    "vision_end": 151653,
}
"""Special token ids of the released tokenizer (the chat template's vocabulary)."""

CODEC = {
    "pad": 2148, "bos": 2149, "eos": 2150, "nothink": 2155, "think_bos": 2156, "think_eos": 2157,
}  # fmt: skip
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}

_MROPE = {
    "rope_type": "default",
    "rope_theta": 1_000_000.0,
    "mrope_section": [24, 20, 20],
    "interleaved": True,
    "mrope_interleaved": True,
}

FULL_SIZE: dict[str, dict[str, Any]] = {
    "thinker_text": {
        "vocab_size": 152064, "hidden_size": 2048, "intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "max_position_embeddings": 65536, "rope_parameters": _MROPE,
        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rms_norm_eps": 1e-6,
    },
    "audio": {
        "d_model": 1280, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
        "encoder_layers": 32, "num_mel_bins": 128, "max_source_positions": 1500,
        "downsample_hidden_size": 480, "n_window": 50, "n_window_infer": 800,
        "conv_chunksize": 500, "output_dim": 2048,
    },
    "vision": {
        "depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 4304, "num_heads": 16, "in_channels": 3, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 2048,
        "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24],
    },
    "talker_text": {
        "vocab_size": 3072, "hidden_size": 1024, "intermediate_size": 2048,
        "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 2,
        "head_dim": 128, "max_position_embeddings": 65536, "rope_parameters": _MROPE,
        "moe_intermediate_size": 384, "num_experts": 128, "num_experts_per_tok": 6,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rms_norm_eps": 1e-6, "shared_expert_intermediate_size": 768,
    },
    "code_predictor": {
        "vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 5, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 32768, "num_code_groups": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    },
    "code2wav": {
        "codebook_size": 2048, "hidden_size": 1024, "max_position_embeddings": 8000,
        "num_attention_heads": 16, "num_key_value_heads": 16, "sliding_window": 72,
        "intermediate_size": 3072, "num_hidden_layers": 8, "num_quantizers": 16,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
    },
}  # fmt: skip
"""The released Qwen3-Omni-30B-A3B-Instruct dimensions (its config.json)."""
FULL_ACCEPT_HIDDEN_LAYER = 24

_TINY_LM = {
    "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
}  # fmt: skip
_TINY_MROPE = {**_MROPE, "mrope_section": [2, 3, 3]}
TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "thinker_text": {
        **_TINY_LM, "num_hidden_layers": 3, "moe_intermediate_size": 32, "num_experts": 8,
        "num_experts_per_tok": 2, "rope_parameters": _TINY_MROPE,
    },
    "audio": {
        "d_model": 32, "encoder_attention_heads": 4, "encoder_ffn_dim": 64, "encoder_layers": 2,
        "downsample_hidden_size": 32, "output_dim": 64,
    },
    "vision": {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4,
        "out_hidden_size": 64, "deepstack_visual_indexes": [1],
    },
    "talker_text": {
        **_TINY_LM, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "shared_expert_intermediate_size": 64, "rope_parameters": _TINY_MROPE,
    },
    "code_predictor": dict(_TINY_LM),
    "code2wav": {
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 64, "num_hidden_layers": 2, "decoder_dim": 64,
    },
}  # fmt: skip
"""What `tiny` changes: a model that builds and runs on a CPU in well under a second."""
TINY_ACCEPT_HIDDEN_LAYER = 2


def _with_both_rope_spellings(section: dict[str, Any]) -> dict[str, Any]:
    """Add transformers 4.x's `rope_theta`/`rope_scaling` beside 5.x's `rope_parameters`."""
    rope = section.get("rope_parameters")
    if rope is None:
        return section
    section["rope_theta"] = rope["rope_theta"]
    if "mrope_section" in rope:
        section["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return section


def omni_config(tiny: bool = False) -> Qwen3OmniMoeConfig:
    """The whole model's config: full size, or the tiny model of the same architecture."""
    dims = copy.deepcopy(FULL_SIZE)
    if tiny:
        for part, changes in TINY_OVERRIDES.items():
            dims[part].update(copy.deepcopy(changes))
    for part in ("thinker_text", "talker_text", "code_predictor", "code2wav"):
        _with_both_rope_spellings(dims[part])
    accept_layer = TINY_ACCEPT_HIDDEN_LAYER if tiny else FULL_ACCEPT_HIDDEN_LAYER
    t = TOKENS
    thinker = {
        "audio_config": dims["audio"],
        "vision_config": dims["vision"],
        "text_config": dims["thinker_text"],
        "audio_token_id": t["audio"],
        "image_token_id": t["image"],
        "video_token_id": t["video"],
        "audio_start_token_id": t["audio_start"],
        "user_token_id": t["user"],
        "position_id_per_seconds": 13,
        "vision_start_token_id": t["vision_start"],
        "vision_end_token_id": t["vision_end"],
        "audio_end_token_id": t["audio_end"],
        "seconds_per_chunk": 2,
    }
    talker = {
        "text_config": dims["talker_text"],
        "code_predictor_config": dims["code_predictor"],
        "num_code_groups": 16,
        "thinker_hidden_size": dims["thinker_text"]["hidden_size"],
        "accept_hidden_layer": accept_layer,
        "codec_eos_token_id": CODEC["eos"],
        "codec_nothink_id": CODEC["nothink"],
        "codec_think_bos_id": CODEC["think_bos"],
        "codec_think_eos_id": CODEC["think_eos"],
        "codec_pad_id": CODEC["pad"],
        "codec_bos_id": CODEC["bos"],
        "audio_token_id": t["audio"],
        "image_token_id": t["image"],
        "video_token_id": t["video"],
        "vision_start_token_id": t["vision_start"],
        "audio_start_token_id": t["audio_start"],
        "position_id_per_seconds": 13,
        "speaker_id": dict(SPEAKERS),
        "spatial_merge_size": 2,
        "audio_end_token_id": t["audio_end"],
        "seconds_per_chunk": 2,
    }
    return Qwen3OmniMoeConfig(  # type: ignore[no-untyped-call]
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=dims["code2wav"],
        enable_audio_output=True,
        im_start_token_id=t["im_start"],
        im_end_token_id=t["im_end"],
        tts_pad_token_id=t["tts_pad"],
        tts_bos_token_id=t["tts_bos"],
        tts_eos_token_id=t["tts_eos"],
        system_token_id=t["system"],
        user_token_id=t["user"],
        assistant_token_id=t["assistant"],
    )
