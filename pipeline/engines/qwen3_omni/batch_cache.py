"""Several requests' KV caches as one batch for a decode step, and back.

Requests sit at different lengths, so a batched decode step needs their caches side by side:
each request's keys and values are left-padded to the longest, the padding is masked out,
and each row gets its own (mRoPE) position, so the step computes exactly what each request's
own step would. After the step each row, minus its padding, becomes that request's cache
again: a request can join or leave the batch between any two steps.

This copies every cache in and out per step: the simple form of continuous batching, right
for the tiny CPU model. On a GPU the same step belongs on a static or paged cache that rows
index into, so that nothing is copied and the step can be captured.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    layers = []
    for layer in cache.layers:
        assert layer.keys is not None and layer.values is not None
        layers.append((layer.keys, layer.values))
    return layers


def stack_caches(caches: Sequence[DynamicCache]) -> tuple[DynamicCache, list[int]]:
    """One cache of batch len(caches), left-padded; and each row's padding. A cache with
    nothing in it yet (a row with no past beside rows with one) is all padding."""
    lengths = [cache.get_seq_length() for cache in caches]
    longest = max(lengths)
    pads = [longest - length for length in lengths]
    per_request = [_layers(cache) for cache in caches]
    shaped = next((layers for layers in per_request if layers), [])
    empty = [(keys[:, :, :0], values[:, :, :0]) for keys, values in shaped]
    per_request = [layers or empty for layers in per_request]
    batched = DynamicCache()
    for index in range(len(per_request[0])):
        keys = torch.cat(
            [
                F.pad(layers[index][0], (0, 0, pad, 0))
                for layers, pad in zip(per_request, pads, strict=True)
            ]
        )
        values = torch.cat(
            [
                F.pad(layers[index][1], (0, 0, pad, 0))
                for layers, pad in zip(per_request, pads, strict=True)
            ]
        )
        batched.update(keys, values, index)
    return batched, pads


def padding_mask(pads: Sequence[int], length: int, device: torch.device) -> torch.Tensor:
    """[batch, length]: 0 over each row's left padding, 1 elsewhere."""
    mask = torch.ones(len(pads), length, dtype=torch.long, device=device)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return mask


def row_cache(batched: DynamicCache, row: int, start: int, end: int | None) -> DynamicCache:
    """A private copy of positions `start:end` of one row of a batched cache, as a batch of
    one (copies: the batch's tensors can be let go)."""
    cache = DynamicCache()
    for index, (keys, values) in enumerate(_layers(batched)):
        cache.update(
            keys[row : row + 1, :, start:end].clone(),
            values[row : row + 1, :, start:end].clone(),
            index,
        )
    return cache


def split_cache(batched: DynamicCache, pads: Sequence[int]) -> list[DynamicCache]:
    """Each row's cache, without its padding (copies: the batch's tensors are let go)."""
    return [row_cache(batched, row, pad, None) for row, pad in enumerate(pads)]


def crop_copy(cache: DynamicCache, length: int) -> DynamicCache:
    """A private copy of the first `length` positions of a batch-of-one cache."""
    return row_cache(cache, 0, 0, length)
