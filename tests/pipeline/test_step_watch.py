"""A model thread's progress: stalled only while busy past its bound, long steps allowed."""

from __future__ import annotations

import threading
import time

from pipeline.engines.cascade.batching import BatchWorker
from pipeline.step_watch import StepWatch, first_stall, long_step, step_done


def test_an_idle_thread_is_never_stalled() -> None:
    watch = StepWatch("the model thread")
    assert watch.stalled(0.0) is None
    with watch.busy():
        pass
    time.sleep(0.02)
    assert watch.stalled(0.01) is None


def test_a_busy_thread_is_stalled_past_its_bound_until_it_makes_progress() -> None:
    watch = StepWatch("the model thread")
    release = threading.Event()
    stepped = threading.Event()

    def work() -> None:
        with watch.busy():
            release.wait(5)
            step_done()
            stepped.set()
            release.wait(5)

    thread = threading.Thread(target=work)
    thread.start()
    try:
        time.sleep(0.1)
        reason = watch.stalled(0.05)
        assert reason is not None and reason.startswith("the model thread has made no progress")
        assert watch.stalled(5.0) is None
        release.set()
        stepped.wait(5)
        assert watch.stalled(0.05) is None  # the stamp started the clock again
    finally:
        release.set()
        thread.join(5)
    assert watch.stalled(0.0) is None


def test_a_declared_long_step_is_allowed_its_own_bound_and_ends_in_progress() -> None:
    watch = StepWatch("the model thread")
    with watch.busy():
        with long_step(10.0):
            time.sleep(0.05)
            assert watch.stalled(0.01) is None
        assert watch.stalled(0.01) is None  # its end was progress
        time.sleep(0.05)
        assert watch.stalled(0.01) is not None  # and the stage's bound is back
        assert first_stall([None, StepWatch("idle"), watch], 0.01) is not None
        assert first_stall([StepWatch("idle")], 0.01) is None


def test_declaring_outside_any_watch_does_nothing() -> None:
    with long_step(1.0):
        step_done()


def test_the_cascade_batch_thread_is_watched_and_its_runner_stamps_steps() -> None:
    release = threading.Event()
    stamped = threading.Event()

    class Item:
        cancelled = False

    def run_batch(items: list[Item]) -> None:
        step_done()  # a step inside the batch (a decoding step)
        stamped.set()
        release.wait(5)

    worker: BatchWorker[Item] = BatchWorker("parley-test", run_batch, window_s=0.0)
    worker.start()
    try:
        assert worker.watch.stalled(0.0) is None  # idle
        worker.submit(Item())
        assert stamped.wait(5)
        time.sleep(0.1)
        reason = worker.watch.stalled(0.05)
        assert reason is not None and reason.startswith("the parley-test thread")
    finally:
        release.set()
        worker.close()
        worker.join(5)
