"""Camera frames to the vision tower's input: each sampled frame is one image.

Qwen3-Omni's image processor is transformers' `Qwen2VLImageProcessor` (16-pixel patches,
2x2 merged into one token, two temporal slices per patch). Each frame is resized to at most
`max_pixels` (128 tokens by default: a camera frame needs no more for a conversation, and
every token is prefill time), patched, and put in the prompt as
`<|vision_start|>` + one `<|image_pad|>` per token + `<|vision_end|>`. Frames go in as
separate images rather than as one video: the session samples a few frames from its cache,
not a clip at a steady rate. A frame that cannot be decoded is skipped.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from PIL import Image, UnidentifiedImageError
from transformers import Qwen2VLImageProcessor

from ...types import VideoFrame

log = logging.getLogger("parley.pipeline.qwen3_omni")

TOKEN_PIXELS = 32 * 32
"""Pixels per vision token (16-pixel patches, merged 2x2)."""


@dataclass(frozen=True, slots=True)
class VisionInput:
    pixel_values: torch.Tensor
    """[patches, channels * temporal * patch * patch]"""
    grid_thw: torch.Tensor
    """[images, 3]: each image's patch grid (time, height, width)"""
    tokens: list[int]
    """image placeholder tokens per image"""


class FrameImages:
    def __init__(
        self,
        *,
        patch_size: int = 16,
        merge_size: int = 2,
        temporal_patch_size: int = 2,
        max_pixels: int = 128 * TOKEN_PIXELS,
        min_pixels: int = 4 * TOKEN_PIXELS,
    ) -> None:
        self.merge_size = merge_size
        self._processor = Qwen2VLImageProcessor(
            patch_size=patch_size,
            merge_size=merge_size,
            temporal_patch_size=temporal_patch_size,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
        )

    def __call__(self, frames: Sequence[VideoFrame]) -> VisionInput | None:
        """None when there is no frame (or none decodes)."""
        images = []
        for frame in frames:
            try:
                with Image.open(io.BytesIO(frame.image)) as image:
                    images.append(image.convert("RGB"))
            except (UnidentifiedImageError, OSError, ValueError) as exc:
                log.warning("a video frame at %d ms does not decode: %s", frame.timestamp_ms, exc)
        if not images:
            return None
        out = self._processor(images=images, return_tensors="pt")
        grid = out["image_grid_thw"]
        tokens = [int(t * h * w) // self.merge_size**2 for t, h, w in grid.tolist()]
        return VisionInput(out["pixel_values"], grid, tokens)


def warm_up_frame(width: int = 320, height: int = 240) -> VideoFrame:
    """A grey camera frame (JPEG), for a stage's warm-up prefill."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (128, 128, 128)).save(out, format="JPEG")
    return VideoFrame(image=out.getvalue(), timestamp_ms=0)
