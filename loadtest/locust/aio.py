"""One asyncio event loop per Locust process, hosted in a greenlet.

Locust runs its users as greenlets on gevent's monkey-patched standard library, while the
clients (websockets, httpx, aiortc) are asyncio. The loop runs in a greenlet, not in a native
thread: under the patching a native thread starves aiortc's decoder "threads" (greenlets),
and the loop's selector is gevent's, so waiting on sockets lets every other greenlet run.

A user greenlet hands a coroutine to the loop and waits on a gevent `AsyncResult`, never on
`Future.result()` (that would block the only OS thread, loop included). A ticker on the loop
yields to gevent every `YIELD_S` even when the loop is never idle, and measures the loop's
own lag: how late a timer fires is the load generator's overload, not the server's slowness.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import gevent
from gevent.event import AsyncResult

T = TypeVar("T")

YIELD_S = 0.05
"""How often the loop lets the other greenlets (Locust's runner, stats, users) run."""
LAG_EVERY = 20
"""One lag sample in this many ticks (once a second)."""


class LoopHost:
    """The process's asyncio loop, run forever in a greenlet of its own."""

    def __init__(self, on_lag: Callable[[float], None]) -> None:
        self.loop = asyncio.new_event_loop()
        self._on_lag = on_lag
        self._stop = asyncio.Event()
        self._greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        # The ticker is the loop's main coroutine, no task of its own: `stop()` ends it,
        # and the loop with it.
        self.loop.run_until_complete(self._tick())

    async def _tick(self) -> None:
        count = 0
        while not self._stop.is_set():
            due = time.monotonic() + YIELD_S
            await asyncio.sleep(YIELD_S)
            lag = time.monotonic() - due
            gevent.sleep(0)  # let the greenlets run even when the loop never waits
            count += 1
            if count % LAG_EVERY == 0:
                self._on_lag(max(0.0, lag) * 1000)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the loop; the calling greenlet waits, the others go on."""
        result: AsyncResult = AsyncResult()
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)

        def done(f: concurrent.futures.Future[T]) -> None:
            if f.cancelled():
                result.set_exception(asyncio.CancelledError())
            elif (error := f.exception()) is not None:
                result.set_exception(error)
            else:
                result.set(f.result())

        future.add_done_callback(done)
        try:
            value: T = result.get(timeout=timeout_s)
        except gevent.Timeout as exc:
            future.cancel()
            raise TimeoutError(f"the session took over {timeout_s} s") from exc
        except BaseException:
            future.cancel()  # a Locust stop (GreenletExit) ends the session
            raise
        return value

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._greenlet.join(timeout=5)
