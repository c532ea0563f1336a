"""Which frames a turn sends: those of its own moment, sampled evenly, the latest failing
that (sessions/frame_window.py)."""

from __future__ import annotations

from sessions.frame_window import LOOKBACK_MS, FrameWindow, choose_frames, turn_window

RED = [1_000, 1_500, 2_000, 2_500, 3_000]
"""A camera showing red for two seconds, two frames a second (wall ms)."""
BLUE = [8_000, 8_500, 9_000, 9_500, 10_000, 10_500]
"""Then, after a pause, blue."""


def picked(timestamps: list[int], window: FrameWindow | None, n: int = 4) -> list[int]:
    return [timestamps[i] for i in choose_frames(timestamps, window, n, "uniform")]


def test_a_turn_asked_while_the_camera_is_blue_gets_blue_frames_only() -> None:
    window = turn_window(arrived_ms=9_600, ended_ms=10_600)  # spoke 9.6-10.6 s
    assert window == FrameWindow(9_600 - LOOKBACK_MS, 10_600)
    assert picked(RED + BLUE, window) == [9_000, 9_500, 10_000, 10_500]
    assert picked(RED + BLUE, turn_window(1_800, 3_200)) == [1_000, 1_500, 2_500, 3_000]


def test_frames_are_sampled_evenly_inside_the_window_ends_included() -> None:
    frames = list(range(0, 20_000, 500))  # 40 frames, one every 500 ms
    assert picked(frames, FrameWindow(5_000, 10_000), 3) == [5_000, 7_500, 10_000]
    assert picked(frames, FrameWindow(5_000, 10_000), 1) == [10_000]
    newest = choose_frames(frames, FrameWindow(5_000, 10_000), 2, "latest")
    assert [frames[i] for i in newest] == [9_500, 10_000]
    # A window with fewer frames than asked for sends what it holds.
    assert picked(frames, FrameWindow(5_000, 5_600), 4) == [5_000, 5_500]


def test_a_window_that_holds_no_frame_gets_the_picture_on_screen_when_it_opened() -> None:
    # The similar-frame filter kept one frame of each still scene: red, then blue at 8 s.
    still = [1_000, 8_000]
    assert picked(still, turn_window(30_000, 31_000)) == [8_000]
    assert picked(still, turn_window(5_000, 6_000)) == [1_000]


def test_a_window_before_every_frame_gets_the_latest_frames() -> None:
    # Every frame came after the turn ended: the newest num_frames of the cache.
    assert picked(RED + BLUE, turn_window(0, 200)) == [9_000, 9_500, 10_000, 10_500]
    assert picked(RED + BLUE, FrameWindow(0, 500), 3) == [9_500, 10_000, 10_500]
    assert picked([], turn_window(0, 200)) == []


def test_without_a_window_the_whole_cache_is_sampled() -> None:
    # The vLLM-Omni video chat's rule: num_frames from every frame held.
    assert picked(RED + BLUE, None, 3) == [1_000, 8_000, 10_500]  # red and blue
    assert choose_frames(RED + BLUE, None, 2, "latest") == [9, 10]


def test_a_typed_turn_looks_at_the_second_before_it() -> None:
    assert turn_window(20_000, 20_000) == FrameWindow(19_000, 20_000)
    # A turn that ended before its audio arrived (clocks of two processes) still has one.
    assert turn_window(20_000, 19_000) == FrameWindow(19_000, 20_000)
