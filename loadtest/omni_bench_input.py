"""The Qwen3-Omni benchmark's fixed request, and the time limit its rounds keep to.

Shared by the benchmark's phases (`omni_bench`: Parley's graph; `omni_bench_engines`: the
session-KV and Code2Wav phases; `omni_baseline`: transformers' own generate), so that each
measures the same input and stops in time the same way.
"""

from __future__ import annotations

import argparse
import io
import time
from typing import Any

import numpy as np

QUESTION = "What is going on in this video, and what did I just say?"
CLOSE_RESERVE_S = 20.0
"""A phase starts no round that would end later than this before the time limit."""


def make_request(
    index: int, args: argparse.Namespace, *, history: tuple[Any, ...] = (), **session: Any
) -> Any:
    """The fixed input: seeded noise as audio and as camera frames, and the question."""
    from PIL import Image

    from pipeline.types import PipelineRequest, VideoFrame

    rng = np.random.default_rng(index)
    audio = (rng.standard_normal(int(args.audio_s * 16_000)) * 2000).astype(np.int16)
    frames = []
    for k in range(args.frames):
        buffer = io.BytesIO()
        pixels = rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, "JPEG")
        frames.append(VideoFrame(buffer.getvalue(), timestamp_ms=k * 500))
    return PipelineRequest(
        request_id=f"resp_bench_{index}",
        audio=audio,
        text=QUESTION,
        frames=tuple(frames),
        history=history,
        **session,  # session_id and item_ids, where requests have them
    )


def out_of_time(args: argparse.Namespace, needed_s: float = 0.0) -> bool:
    """Whether a round of about `needed_s` would end past the command's time limit, less
    the time kept to close the phase (its stages, its file)."""
    deadline: float | None = args.deadline_epoch
    return deadline is not None and time.time() + needed_s > deadline - CLOSE_RESERVE_S
