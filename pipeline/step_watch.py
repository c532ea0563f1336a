"""Whether an engine's model thread makes progress: what a stage's heartbeat vouches for.

A stage's event loop can be alive while its model thread is stuck (a kernel that never
returns, a deadlock in a native library), so a heartbeat from the loop alone proves
nothing about the engine. An engine whose compute runs on a thread of its own keeps a
`StepWatch`: the thread marks the time it is `busy` with work, and stamps `progress` (or,
from code that does not know the watch, `step_done()`) between the steps of that work (a
decoding step, a rendered clause); an idle thread is never stalled. `stalled(bound_s)`
says why the engine has made no progress for longer than `bound_s` while busy, and the
serving side stops vouching for the stage then (`Engine.stalled`, `worker_main`).

A step known to be long (a CUDA graph capture, a warm-up) declares so from inside the
step with `long_step(seconds)`: until the next progress stamp, the watch of the thread it
runs on allows that much instead of the stage's bound. Code that declares one need not
know which engine or watch it runs under (it may run under none).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator

_current = threading.local()


class StepWatch:
    """One model thread's progress; read from any thread (the event loop's heartbeat)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._depth = 0
        self._since = 0.0
        """When the thread last made progress (or became busy)."""
        self._allowed_s: float | None = None
        """A longer bound declared for the step running now (`long_step`)."""

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """The calling thread works for the engine inside this block."""
        previous = getattr(_current, "watch", None)
        with self._lock:
            if self._depth == 0:
                self._since = time.monotonic()
                self._allowed_s = None
            self._depth += 1
        _current.watch = self
        try:
            yield
        finally:
            _current.watch = previous
            with self._lock:
                self._depth -= 1

    def progress(self) -> None:
        """A step has finished: the clock starts again (and a declared long step is over)."""
        with self._lock:
            self._since = time.monotonic()
            self._allowed_s = None

    def allow(self, seconds: float) -> None:
        """The step running now may take up to `seconds` (see `long_step`)."""
        with self._lock:
            self._allowed_s = max(seconds, self._allowed_s or 0.0)

    def stalled(self, bound_s: float) -> str | None:
        """Why the thread counts as stuck (busy with no progress for longer than its bound),
        or None."""
        with self._lock:
            if self._depth == 0:
                return None
            waited = time.monotonic() - self._since
            bound = max(bound_s, self._allowed_s or 0.0)
        if waited <= bound:
            return None
        return f"{self.name} has made no progress for {waited:.1f} s (bound {bound:g} s)"


def step_done() -> None:
    """Stamp progress on the watch busy on this thread (a no-op where there is none): for
    runners that do not know their engine's watch, called between their steps."""
    watch: StepWatch | None = getattr(_current, "watch", None)
    if watch is not None:
        watch.progress()


@contextlib.contextmanager
def long_step(seconds: float) -> Iterator[None]:
    """Declare that the step running on this thread may take up to `seconds`; its end
    counts as progress. A no-op where no watch is busy on this thread."""
    watch: StepWatch | None = getattr(_current, "watch", None)
    if watch is not None:
        watch.allow(seconds)
    try:
        yield
    finally:
        if watch is not None:
            watch.progress()


def first_stall(watches: Iterable[StepWatch | None], bound_s: float) -> str | None:
    """The first reason any of `watches` gives (for an engine with several threads)."""
    for watch in watches:
        if watch is not None and (reason := watch.stalled(bound_s)) is not None:
            return reason
    return None
