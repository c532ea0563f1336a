"""When each stretch of the input audio arrived (sessions/audio_arrivals.py)."""

from __future__ import annotations

from sessions.audio_arrivals import MERGE_MS, AudioArrivals


class Wall:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def test_audio_is_placed_by_when_it_arrived() -> None:
    wall = Wall()
    arrivals = AudioArrivals(wall)
    assert arrivals.at(0) == wall.ms  # nothing yet: now
    for _ in range(50):  # a second of live audio, 20 ms at a time
        arrivals.heard((wall.ms - 1_000_000) + 20)
        wall.ms += 20
    assert abs(arrivals.at(0) - 1_000_000) <= MERGE_MS
    assert abs(arrivals.at(500) - 1_000_500) <= MERGE_MS
    # A pause of five seconds, then two seconds of audio in one burst.
    wall.ms += 5_000
    arrivals.heard(3_000)
    assert arrivals.at(1_500) == arrivals.at(2_999) == wall.ms
    assert arrivals.at(3_000) == wall.ms  # not received yet: now


def test_it_is_bounded_and_places_forgotten_audio_at_the_oldest_arrival() -> None:
    wall = Wall()
    arrivals = AudioArrivals(wall, max_stretches=10)
    for i in range(1, 101):
        arrivals.heard(i * 100)
        wall.ms += 100
    assert len(arrivals._stretches) == 10
    assert arrivals.at(0) == arrivals.at(9_000) == 1_000_000 + 90 * 100
