"""Camera frames become words: brightness, main colours, motion (synthetic JPEGs)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from pipeline.engines.cascade.vision import describe_frames
from pipeline.types import VideoFrame


def jpeg(rgb: tuple[int, int, int], *, square: tuple[int, int, int] | None = None) -> VideoFrame:
    pixels = np.zeros((240, 320, 3), dtype=np.uint8) + np.array(rgb, dtype=np.uint8)
    if square is not None:
        pixels[40:200, 60:260] = square
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return VideoFrame(image=out.getvalue(), timestamp_ms=0)


def test_a_dark_red_scene_and_a_bright_blue_one() -> None:
    dark_red = describe_frames([jpeg((110, 12, 10))])
    bright_blue = describe_frames([jpeg((110, 170, 255))])
    assert "dark" in dark_red and "red" in dark_red and "blue" not in dark_red
    assert "bright" in bright_blue and "blue" in bright_blue and "red" not in bright_blue


def test_names_two_colours_when_the_scene_has_two() -> None:
    text = describe_frames([jpeg((20, 140, 40), square=(230, 220, 30))])
    assert "green" in text and "yellow" in text


def test_motion_between_frames() -> None:
    still = describe_frames([jpeg((90, 90, 200))] * 3)
    moving = describe_frames([jpeg((90, 90, 200)), jpeg((90, 90, 200), square=(250, 250, 250))])
    assert "nothing moves" in still
    assert "movement" in moving and "lots" in moving


def test_no_frames_or_undecodable_frames_say_nothing() -> None:
    assert describe_frames([]) == ""
    assert describe_frames([VideoFrame(image=b"not an image", timestamp_ms=0)]) == ""
