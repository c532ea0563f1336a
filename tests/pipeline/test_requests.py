"""The request tracker: what an engine holds, through a stream's life, an abort and a close."""

from __future__ import annotations

import pytest

from pipeline.requests import RequestTracker


def test_a_tracked_request_is_held_until_its_stream_ends_even_by_an_error() -> None:
    tracker: RequestTracker[None] = RequestTracker()
    with tracker.track("r1"):
        assert len(tracker) == 1 and "r1" in tracker and not tracker.aborted("r1")
    assert len(tracker) == 0 and tracker.aborted("r1")
    with pytest.raises(RuntimeError), tracker.track("r2"):
        raise RuntimeError("the model broke")
    assert len(tracker) == 0


def test_abort_drops_the_request_at_once_and_hands_back_its_state() -> None:
    tracker: RequestTracker[str] = RequestTracker()
    with tracker.track("r1", "kv slot 3"), tracker.track("r2"):
        assert tracker.abort("r1") == "kv slot 3"
        assert tracker.aborted("r1") and not tracker.aborted("r2")
        assert len(tracker) == 1 and tracker.ids() == {"r2"}
        tracker.set_state("r1", "kv slot 4")  # too late: an aborted request stays gone
        assert tracker.aborted("r1") and tracker.abort("r1") is None
        tracker.set_state("r2", "clause")
        assert tracker.state("r2") == "clause"
    assert len(tracker) == 0


def test_clear_drops_everything_and_returns_the_states_to_free() -> None:
    tracker: RequestTracker[str] = RequestTracker()
    tracker.begin("r1", "a")
    tracker.begin("r2")
    tracker.begin("r3", "c")
    assert sorted(tracker.clear()) == ["a", "c"]
    assert len(tracker) == 0 and tracker.aborted("r2")
    assert tracker.end("r2") is None  # a stream ending after the close finds nothing
