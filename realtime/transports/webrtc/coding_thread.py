"""The process's coding thread: jobs handed over without waking anyone.

`OpusAhead` hands a frame to code every 20 ms per speaking call. Through a
`ThreadPoolExecutor` each hand-over woke the pool's sleeping thread (a futex wake), which on
a busy 2-core host often preempted the event loop while the loop held the GIL: py-spy put
a fifth of the loop's time at `submit` (20 calls). Here the thread wakes on its own clock
instead: every `POLL_S` it codes what is queued, and a hand-over is a deque append. A job
waits at most `POLL_S` to begin, well inside the 20 ms it has. With nothing handed over for
`IDLE_S` it sleeps until the next job wakes it (one wake per burst of calls, not per frame).

Jobs are `concurrent.futures.Future`s, so the caller can cancel one that has not begun and
await one that has (`asyncio.wrap_future`).
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

POLL_S = 0.004
IDLE_S = 1.0


class CodingThread:
    """One thread running handed-over jobs in order. `close()` stops it (idempotent)."""

    def __init__(self, name: str = "opus-ahead") -> None:
        self._jobs: collections.deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]]
        self._jobs = collections.deque()
        self._wake = threading.Event()
        self._sleeping = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """`fn()` on the thread, within about `POLL_S`."""
        if self._closed:
            raise RuntimeError("the coding thread is closed")
        job: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.append((job, fn))
        if self._sleeping:
            self._wake.set()
        return job

    def close(self) -> None:
        """Stop taking jobs, cancel those not begun, and join the thread."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        while self._jobs:
            self._jobs.popleft()[0].cancel()

    def _run(self) -> None:
        last_job = time.monotonic()
        while not self._closed:
            if self._jobs:
                last_job = time.monotonic()
                self._run_queued()
            elif time.monotonic() - last_job > IDLE_S:
                self._sleeping = True
                self._wake.clear()
                if not self._jobs:  # a job handed over since saw `_sleeping` unset
                    self._wake.wait()
                self._sleeping = False
                last_job = time.monotonic()
                continue
            time.sleep(POLL_S)

    def _run_queued(self) -> None:
        while self._jobs and not self._closed:
            job, fn = self._jobs.popleft()
            if not job.set_running_or_notify_cancel():
                continue  # cancelled before it began
            try:
                result = fn()
            except BaseException as exc:  # handed to whoever awaits the job
                job.set_exception(exc)
            else:
                job.set_result(result)


_thread: CodingThread | None = None
_lock = threading.Lock()


def coding_thread() -> CodingThread:
    """The process's coding thread, started on first use and closed at exit."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = CodingThread()
            atexit.register(_thread.close)
        return _thread
