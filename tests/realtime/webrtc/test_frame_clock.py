"""A WebRTC frame's RTP timestamp on the session's clock
(realtime/transports/webrtc/frame_clock.py)."""

from __future__ import annotations

from fractions import Fraction

from realtime.transports.webrtc.frame_clock import RESYNC_MS, FrameClock

VIDEO = Fraction(1, 90_000)
START = 3_000_000_000  # an RTP timestamp starts anywhere


def test_frames_keep_the_camera_spacing_whatever_their_delay() -> None:
    clock = FrameClock()
    # 10 fps; arrivals delayed by 40 ms, except the third (held up 300 ms in a busy loop).
    delays = [40, 45, 340, 40, 42]
    stamps = [
        clock.stamp(START + k * 9_000, VIDEO, 50_000 + k * 100 + delay)
        for k, delay in enumerate(delays)
    ]
    assert stamps == [50_040, 50_140, 50_240, 50_340, 50_440]
    # Never later than it arrived; a faster frame moves the offset down.
    assert clock.stamp(START + 5 * 9_000, VIDEO, 50_510) == 50_510
    assert clock.stamp(START + 6 * 9_000, VIDEO, 50_640) == 50_610


def test_a_jump_in_the_rtp_time_starts_again_from_the_arrival() -> None:
    clock = FrameClock()
    assert clock.stamp(START, VIDEO, 10_000) == 10_000
    # The sender's clock jumps back (a new stream): stamped on arrival, then spaced.
    assert clock.stamp(5, VIDEO, 10_100) == 10_100
    assert clock.stamp(5 + 90_000, VIDEO, 11_150) == 11_100
    # A stall longer than RESYNC_MS: the frame after it lands where it arrived.
    assert clock.stamp(5 + 2 * 90_000, VIDEO, 12_100 + RESYNC_MS + 1) == 12_100 + RESYNC_MS + 1


def test_a_frame_without_a_timestamp_is_stamped_on_arrival() -> None:
    assert FrameClock().stamp(None, VIDEO, 7_000) == 7_000
    assert FrameClock().stamp(90_000, None, 7_000) == 7_000
