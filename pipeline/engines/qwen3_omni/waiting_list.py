"""Work waiting for a model thread: added on the event loop, taken on the model thread.

The gathered queues (`prefill_queue.py`, `gathered_calls.py`) take their batch on the model
thread when its turn comes, so that everything asked for until then is in it. The list is
therefore shared by two threads, under a lock; each entry has the future its asker awaits,
answered on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class WaitingList(Generic[ItemT, ResultT]):
    def __init__(self) -> None:
        self._entries: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._lock = threading.Lock()
        self.changed = asyncio.Event()
        """Set when an entry is added (or by the owner, when what it waits for changed)."""

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, item: ItemT) -> asyncio.Future[ResultT]:
        """On the event loop: `item` waits; its asker awaits the future returned."""
        waiter: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._entries.append((item, waiter))
        self.changed.set()
        return waiter

    def take(self, most: int) -> list[tuple[ItemT, asyncio.Future[ResultT]]]:
        """On any thread: up to `most` entries, oldest first, those whose asker is still there."""
        with self._lock:
            taken, self._entries = self._entries[:most], self._entries[most:]
        return [(item, waiter) for item, waiter in taken if not waiter.cancelled()]

    async def wait(self) -> None:
        """Until something waits."""
        while not self._entries:
            self.changed.clear()
            await self.changed.wait()

    def fail_all(self, message: str) -> None:
        """On the event loop: every entry still waiting fails with `message`."""
        for _, waiter in self.take(len(self._entries)):
            fail(waiter, RuntimeError(message))

    def device_lost(
        self, taken: list[tuple[ItemT, asyncio.Future[ResultT]]], error: BaseException, name: str
    ) -> None:
        """After a sticky device error (`ModelThread.fatal`), on the event loop: the calls
        `taken` fail with `error`, and every entry still waiting fails too (nothing will run
        again: retrying one at a time would only fail each on its own)."""
        for _, waiter in taken:
            fail(waiter, error)
        self.fail_all(f"{name}: {error}")


def answer(waiter: asyncio.Future[ResultT], result: ResultT) -> None:
    if not waiter.done():
        waiter.set_result(result)


def fail(waiter: asyncio.Future[ResultT], error: BaseException) -> None:
    if not waiter.done():
        waiter.set_exception(error)
