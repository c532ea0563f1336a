"""The one thread that owns a stage's model: every torch call of the stage runs on it.

Model compute must never run on the event loop, and one model is not safe to call from two
threads at once, so each engine submits its work (a prefill, a decode step, a frame, a
chunk) to this thread. Work runs in submission order, so concurrent requests interleave at
step granularity: a long reply does not hold back another session's first audio for longer
than one step. Cancelling a waiting call drops it before it runs; a call already running
finishes and its result is discarded (steps are milliseconds long). Each call is one step
of the thread's `watch` (a call known to be long declares so: `step_watch.long_step`).

A call that fails with a sticky device error (`device_faults.sticky_reason`: the process's
CUDA context is unusable from then on) marks the thread `fatal`: every later call fails at
once with `DeviceLost` instead of running, and the engine reports itself broken
(`Engine.broken`), so that the process serving it exits and is started again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import torch

from ...device_faults import DeviceLost, injected_fault, sticky_reason
from ...step_watch import StepWatch

log = logging.getLogger("parley.pipeline.qwen3_omni")

P = ParamSpec("P")
T = TypeVar("T")


class ModelThread:
    def __init__(self, name: str, threads: int | None = None) -> None:
        self.name = name
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self.watch = StepWatch(f"the {name} thread")
        self.fatal: str | None = None
        """Why the thread's device can run nothing more (a sticky error), once one was seen."""

    def _step(self, job: Callable[[], T]) -> T:
        if self.fatal is not None:
            raise DeviceLost(f"{self.name}: the device failed earlier ({self.fatal})")
        with self.watch.busy():
            try:
                if (fault := injected_fault(self.name)) is not None:
                    raise fault
                return job()
            except Exception as exc:
                if self.fatal is None and (reason := sticky_reason(exc)) is not None:
                    self.fatal = reason
                    log.critical(
                        "%s: sticky device error, the engine is broken: %s", self.name, reason
                    )
                raise

    def start(self) -> None:
        if self._executor is None:
            if self.threads:
                torch.set_num_threads(self.threads)  # process-wide, as torch has it
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._executor is None:
            raise RuntimeError(f"{self.name}: the model thread is not running")
        if self.fatal is not None:
            raise DeviceLost(f"{self.name}: the device failed earlier ({self.fatal})")
        job = functools.partial(fn, *args, **kwargs)
        return await asyncio.wrap_future(self._executor.submit(self._step, job))

    def post(self, fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
        """Queue `fn` without waiting for it (a request's clean-up from a `finally` that may
        be cancelled: it still runs, after everything queued before it). Its error is logged.
        Nothing happens once the thread is closed (the model and its state are gone)."""
        if self._executor is not None:
            job = functools.partial(fn, *args, **kwargs)
            self._executor.submit(self._step, job).add_done_callback(self._log_failure)

    def _log_failure(self, done: Future[object]) -> None:
        if done.cancelled() or (error := done.exception()) is None:
            return
        if isinstance(error, DeviceLost):  # the device is gone: nothing left to clean up
            log.debug("%s: a queued clean-up was not run: %s", self.name, error)
        else:
            log.error("%s: a queued clean-up failed", self.name, exc_info=error)

    async def close(self) -> None:
        """Wait for the running call (if any) and stop; idempotent."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
