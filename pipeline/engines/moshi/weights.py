"""Building Moshi: full size (Kyutai's `moshiko` configuration, transformers' defaults) or a
toy of the same architecture for tests and the CPU, with random weights unless a checkpoint
in the Hugging Face layout is given. Nothing is downloaded."""

from __future__ import annotations

from typing import Any

import torch

TINY_MIMI: dict[str, Any] = {
    "model_type": "mimi",
    "hidden_size": 32,
    "num_filters": 4,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "codebook_size": 32,
    "num_quantizers": 8,
    "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16,
    "upsample_groups": 32,
    "sliding_window": 16,
}
"""Mimi at toy size: the real frame (80 ms at 24 kHz, upsampling 8*6*5*4*2) and 8 codebooks."""


def moshi_config(tiny: bool) -> Any:
    from transformers import MoshiConfig

    if not tiny:
        return MoshiConfig()  # type: ignore[no-untyped-call]  # moshiko: 7B main, 6-layer depth transformer, Mimi
    return MoshiConfig(  # type: ignore[no-untyped-call]
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        ffn_dim=128,
        audio_vocab_size=32,
        num_codebooks=8,
        sliding_window=256,
        max_position_embeddings=256,
        depth_decoder_config={
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "ffn_dim": 64,
        },
        audio_encoder_config=dict(TINY_MIMI),
    )


def load_moshi(
    *, tiny: bool, device: str, dtype: torch.dtype, model_path: str | None = None, seed: int = 0
) -> Any:
    """The model in eval mode on `device`: from `model_path`, or random (seeded)."""
    from transformers import MoshiForConditionalGeneration

    if model_path:
        model = MoshiForConditionalGeneration.from_pretrained(
            model_path, dtype=dtype, attn_implementation="sdpa"
        )
    else:
        torch.manual_seed(seed)
        config = moshi_config(tiny)
        config._attn_implementation = "sdpa"
        with torch.device(device):
            model = MoshiForConditionalGeneration._from_config(config, dtype=dtype)
        random_codebooks(model.audio_encoder, seed)
    return model.to(device).eval()


def random_codebooks(codec: Any, seed: int) -> None:
    """Random centroids for Mimi's quantizer. transformers leaves them at zero (buffers a
    checkpoint fills), so a random-weight codec would give every frame code 0 in every
    codebook: the toy model would hear nothing of its microphone and the codec's tests
    would compare zeros."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in codec.quantizer.modules():
            if hasattr(module, "embed_sum") and hasattr(module, "cluster_usage"):
                centroids = torch.randn(module.embed_sum.shape, generator=generator)
                module.embed_sum.copy_(centroids)
                module.cluster_usage.fill_(1.0)
                module._embed = None  # transformers caches embed_sum / cluster_usage
