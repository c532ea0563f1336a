"""The one thread that owns a stage's model: every torch call of the stage runs on it.

Model compute must never run on the event loop, and one model is not safe to call from two
threads at once, so each engine submits its work (a prefill, a decode step, a frame, a
chunk) to this thread. Work runs in submission order, so concurrent requests interleave at
step granularity: a long reply does not hold back another session's first audio for longer
than one step. Cancelling a waiting call drops it before it runs; a call already running
finishes and its result is discarded (steps are milliseconds long).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
T = TypeVar("T")


class ModelThread:
    def __init__(self, name: str, threads: int | None = None) -> None:
        self.name = name
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None

    def start(self) -> None:
        if self._executor is None:
            if self.threads:
                torch.set_num_threads(self.threads)  # process-wide, as torch has it
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._executor is None:
            raise RuntimeError(f"{self.name}: the model thread is not running")
        return await asyncio.wrap_future(self._executor.submit(fn, *args, **kwargs))

    async def close(self) -> None:
        """Wait for the running call (if any) and stop; idempotent."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
