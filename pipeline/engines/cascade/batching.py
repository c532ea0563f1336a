"""A worker thread that runs queued work items in batches: the cascade engines' batcher.

Engines here batch across the requests of all sessions the simple way that suits a CPU: one
thread per engine owns the model. An item submitted while the thread is idle waits a short
window (default 20 ms) for company, then everything queued (up to `max_batch`) runs as one
batch; items submitted while a batch runs are queued for the next one. An item cancelled
before its batch starts is dropped without running.

The thread never waits on a consumer: results leave it through `loop.call_soon_threadsafe`,
so a request whose reader has gone away costs at most the rest of its current batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ...step_watch import StepWatch

log = logging.getLogger("parley.pipeline.cascade")


class BatchItem(Protocol):
    @property
    def cancelled(self) -> bool: ...


ItemT = TypeVar("ItemT", bound=BatchItem)


class BatchWorker(Generic[ItemT]):
    """Collects items and hands them to `run_batch` in batches, on its own thread.

    `run_batch` must deliver every item's result (or error) itself; an exception escaping
    it is logged and the thread carries on with the next batch.
    """

    def __init__(
        self,
        name: str,
        run_batch: Callable[[list[ItemT]], None],
        *,
        window_s: float = 0.02,
        max_batch: int = 8,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.name = name
        self.window_s = window_s
        self.max_batch = max_batch
        self.last_batch_size = 0
        self.watch = StepWatch(f"the {name} thread")
        """Busy while a batch runs; `run_batch` may stamp progress within a long batch
        (`step_watch.step_done`), else the whole batch is one step."""
        """How many items the most recent batch ran (cancelled items not counted)."""
        self._run_batch = run_batch
        self._pending: list[tuple[float, ItemT]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, item: ItemT) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            self._pending.append((time.monotonic(), item))
            self._cond.notify()

    def discard(self, item: ItemT) -> None:
        """Forget an item that has not started yet (no-op otherwise)."""
        with self._cond:
            self._pending = [(at, it) for at, it in self._pending if it is not item]

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def close(self) -> None:
        """Stop taking work; the thread ends after its current batch. Idempotent."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _next_batch(self) -> list[ItemT] | None:
        with self._cond:
            while True:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                deadline = self._pending[0][0] + self.window_s
                while len(self._pending) < self.max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._closed:
                    return None
                taken = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                batch = [item for _, item in taken if not item.cancelled]
                if batch:
                    self.last_batch_size = len(batch)
                    return batch

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                with self.watch.busy():
                    self._run_batch(batch)
            except Exception:
                log.exception("%s: a batch of %d failed", self.name, len(batch))
