"""What the camera shows, in words a small language model can use.

SmolLM2 reads no images, so the Thinker is told a few robust facts about the frames instead:
how bright the scene is, its main colours, and whether anything moves. They come from plain
image statistics (Pillow and numpy, a millisecond a frame), which makes the camera really
inform the answer ("it is dark where you are", "I see a lot of blue") without a vision model.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from PIL import Image, UnidentifiedImageError

from ...types import VideoFrame

THUMBNAIL = (48, 48)
DARK, DIM = 60.0, 120.0
"""Mean luma (0-255) below which a scene is dark, or dim."""
STILL, SOME_MOTION = 4.0, 14.0
"""Mean absolute grey difference (0-255) between consecutive thumbnails."""
MIN_COLOUR_SHARE = 0.12


def describe_frames(frames: Sequence[VideoFrame]) -> str:
    """One sentence about the frames ("" when there are none or none decodes)."""
    images = [image for frame in frames if (image := _decode(frame.image)) is not None]
    if not images:
        return ""
    last = images[-1]
    parts = [f"a {brightness(last)} scene", "mostly " + _join(dominant_colours(last))]
    if len(images) > 1:
        parts.append(motion(images))
    return ", ".join(parts) + "."


def brightness(image: Image.Image) -> str:
    luma = float(np.asarray(image.convert("L"), dtype=np.float32).mean())
    return "dark" if luma < DARK else "dim" if luma < DIM else "bright"


def dominant_colours(image: Image.Image, top: int = 3) -> list[str]:
    """The coarse colour names covering most of the image, commonest first."""
    hsv = np.asarray(image.convert("HSV"), dtype=np.float32).reshape(-1, 3) / 255.0
    counts = Counter(_colour_name(h * 360.0, s, v) for h, s, v in hsv)
    total = sum(counts.values())
    names = [name for name, n in counts.most_common(top) if n / total >= MIN_COLOUR_SHARE]
    return names or [counts.most_common(1)[0][0]]


def motion(images: Sequence[Image.Image]) -> str:
    greys = [_grey(image) for image in images]
    diffs = [float(np.abs(a - b).mean()) for a, b in zip(greys, greys[1:], strict=False)]
    change = max(diffs)
    if change < STILL:
        return "and nothing moves"
    return "with some movement" if change < SOME_MOTION else "with lots of movement"


def _decode(data: bytes) -> Image.Image | None:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.draft("RGB", THUMBNAIL)  # lets JPEG decode at a fraction of its size
            small = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError):
        return None
    small.thumbnail(THUMBNAIL)
    return small


def _grey(image: Image.Image) -> npt.NDArray[np.float32]:
    return np.asarray(image.convert("L").resize((16, 16)), dtype=np.float32)


def _colour_name(hue: float, saturation: float, value: float) -> str:
    if value < 0.18:
        return "black"
    if saturation < 0.2:
        return "white" if value > 0.8 else "grey"
    if hue < 15 or hue >= 340:
        return "red"
    if hue < 40:
        return "brown" if value < 0.6 else "orange"
    if hue < 70:
        return "yellow"
    if hue < 165:
        return "green"
    if hue < 255:
        return "blue"
    if hue < 290:
        return "purple"
    return "pink"


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
