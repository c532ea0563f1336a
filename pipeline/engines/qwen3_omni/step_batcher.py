"""Continuous batching: the decode steps that requests ask for run together, one forward each.

Each request's generator asks for its next step and waits; one dispatcher task takes every
step asked for (up to `max_batch`) and runs them as one batched call on the model thread.
A request joins the batch at its first step after its prefill and leaves it when it ends or
is aborted; nobody waits for a batch to fill. While a batch runs, the steps of the next one
gather. Requests in their decode phase say so (`member()`), and before each batch the
dispatcher gives the members a moment (`regroup_s`) to ask for their next step: without it,
two requests whose prefills ended at different times would alternate in batches of one
forever. A step whose waiter has gone (cancelled, aborted) is dropped before it runs.

When more steps wait than one batch takes, a batch takes those due first. A step may carry a
deadline (`step(item, deadline)`: for the audio stages, when the request's listener runs out
of audio, `playback.Playback`); one without is due when it was asked for, so steps without
deadlines run first come, first served, as they always did. With deadlines in play the
regroup waits for every member's step (not just a batch's worth), so that the requests just
answered are in the choice too: otherwise, with two requests and batches of one, they would
only ever alternate. (A member held up by its reader, one whose listener is far enough ahead
for playout to push back, costs each batch up to `regroup_s` so, as it did before within a
batch's worth of members: there is slack then.) Nothing starves: a step's deadline stays
where it is while it waits, and those that pass it move on (each step served moves its
request's deadline later, and new requests are due later as real time passes), so a step
far ahead runs once the others catch up with it.

One request's error fails that request, not its batch: a batch whose run raises is run
again in halves (each half one call, a failing half halved again) until the failing steps
are alone; those fail with their error and the others are answered. The runners change a
request's state only once its forward pass has returned, so a step that raised can run again.
An error that leaves the device unusable (`ModelThread.fatal`) is not retried: the batch
fails whole, and so does every later step (`DeviceLost`).

Work that must not hold up the steps (a streamed turn's prefill, `staging_queue.py`) waits
for the next batch before each piece of it (`next_batch`): steps first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ...tasks import TaskSet
from .model_thread import ModelThread

log = logging.getLogger("parley.pipeline.qwen3_omni")

REPORT_S = 10.0
"""How often a busy batcher logs what its batches were (nothing is logged while idle)."""

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


@dataclass(slots=True)
class BatchTally:
    """What a batcher's batches were since its last report: where a stage's time goes under
    load (how full its steps are, how long each takes on the model thread, how long its steps
    wait for the thread behind other work)."""

    since: float
    batches: int = 0
    steps: int = 0
    largest: int = 0
    run_s: float = 0.0
    """Time the batches ran on the model thread."""
    wait_s: float = 0.0
    """Time from a batch's dispatch to its start on the model thread (other work ahead)."""

    def line(self, name: str, now: float) -> str:
        batches = max(self.batches, 1)
        return (
            f"{name}: {self.batches} batches in {now - self.since:.1f} s, "
            f"{self.steps / batches:.1f} steps each (largest {self.largest}), "
            f"{1000 * self.run_s / batches:.1f} ms each on the model thread "
            f"({100 * self.run_s / max(now - self.since, 1e-9):.0f} % of the time), "
            f"{1000 * self.wait_s / batches:.1f} ms waiting for it"
        )


@dataclass(slots=True)
class _Step(Generic[ItemT, ResultT]):
    item: ItemT
    waiter: asyncio.Future[ResultT]
    due: float
    """Its deadline, or when it was asked for if it has none (on the batcher's clock)."""
    timed: bool
    """It came with a deadline."""


class StepBatcher(Generic[ItemT, ResultT]):
    def __init__(
        self,
        name: str,
        thread: ModelThread,
        run: Callable[[list[ItemT]], list[ResultT]],
        *,
        max_batch: int = 8,
        regroup_s: float = 0.002,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.name = name
        self.thread = thread
        self.run = run
        self.max_batch = max_batch
        self.regroup_s = regroup_s
        self.clock = clock
        """The clock of the deadlines (monotonic seconds); a step without one is due when asked."""
        self.largest_batch = 0
        """The most steps one batch has run (for tests and metrics)."""
        self.overtakes = 0
        """Steps that batches took out of arrival order, ahead of steps asked for before them
        but due later (for tests and metrics): 0 while steps run first come, first served."""
        self._queue: list[_Step[ItemT, ResultT]] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tasks = TaskSet(name)
        """Owns the dispatcher (`_task`); `close()` closes it."""
        self._members = 0
        self.batches_run = 0
        """Batches run so far (answered or failed)."""
        self._ran = asyncio.Event()
        self.isolated = 0
        """Batches that failed and were run again in halves to fail only the steps at fault."""
        self.tally = BatchTally(since=time.perf_counter())

    def start(self) -> None:
        if self._task is None:
            self._task = self._tasks.create_task(self._dispatch(), name=f"{self.name}:batcher")

    async def close(self) -> None:
        """Stop dispatching; steps still waiting fail. Idempotent."""
        self._task = None
        await self._tasks.close()
        for step in self._queue:
            if not step.waiter.done():
                step.waiter.set_exception(RuntimeError(f"{self.name} is closed"))
        self._queue.clear()

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """Around a request's decode loop: the dispatcher waits a moment for its steps."""
        self._members += 1
        try:
            yield
        finally:
            self._members -= 1
            self._arrived.set()  # a regroup waiting for it need not wait any more
            self._ran.set()  # nor work waiting behind its steps

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        """Inside `member()`, while the request waits for something else (its input): the
        dispatcher does not wait for its step meanwhile."""
        self._members -= 1
        self._arrived.set()
        self._ran.set()
        try:
            yield
        finally:
            self._members += 1

    @property
    def decoding(self) -> bool:
        """Whether requests are in their decode phase now (`member()`, not `away()`)."""
        return self._members > 0

    async def next_batch(self, bound_s: float) -> None:
        """Until a batch has run from now on, nobody decodes any more, or `bound_s` passed:
        how work that must not hold up decode steps lets them go first (one piece of it
        between two batches)."""
        seen = self.batches_run
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound_s):
                while self.decoding and self.batches_run == seen:
                    self._ran.clear()
                    await self._ran.wait()

    async def step(self, item: ItemT, deadline: float | None = None) -> ResultT:
        """Run `item` in a batch and return its result. `deadline` (on `clock`): when the step
        is due; None, when it is asked for."""
        if self._task is None:
            raise RuntimeError(f"{self.name} is not running")
        waiter: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        due = self.clock() if deadline is None else deadline
        self._queue.append(_Step(item, waiter, due, timed=deadline is not None))
        self._arrived.set()
        return await waiter

    async def _dispatch(self) -> None:
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            await self._regroup()
            batch = self._take()
            if not batch:
                continue
            self.largest_batch = max(self.largest_batch, len(batch))
            try:
                await self._answer(batch)
            except asyncio.CancelledError:
                for step in batch:  # closed mid-batch: nobody will answer them now
                    if not step.waiter.done():
                        step.waiter.set_exception(RuntimeError(f"{self.name} is closed"))
                raise
            finally:
                self.batches_run += 1
                self._ran.set()

    async def _answer(self, batch: list[_Step[ItemT, ResultT]], retry: bool = False) -> None:
        """Run `batch` as one call and answer its steps; if it raises, find the failing
        steps by halves (see the module's docstring)."""
        live = [step for step in batch if not step.waiter.done()]
        if not live:
            return
        try:
            results = await self.thread.call(
                self._timed, [step.item for step in live], time.perf_counter()
            )
        except Exception as exc:
            if len(live) == 1 or self.thread.fatal is not None:
                _fail(live, exc)
                return
            if not retry:
                self.isolated += 1
                log.warning(
                    "%s: a batch of %d steps failed (%s: %s); running it again in halves to "
                    "fail only the steps at fault",
                    self.name,
                    len(live),
                    type(exc).__name__,
                    exc,
                )
            half = len(live) // 2
            await self._answer(live[:half], retry=True)
            await self._answer(live[half:], retry=True)
            return
        for step, result in zip(live, results, strict=True):
            if not step.waiter.done():
                step.waiter.set_result(result)

    def _timed(self, items: list[ItemT], dispatched: float) -> list[ResultT]:
        """`run` on the model thread, tallied; a report at most every `REPORT_S`."""
        began = time.perf_counter()
        try:
            return self.run(items)
        finally:
            now = time.perf_counter()
            tally = self.tally
            if not tally.batches:
                tally.since = began  # an idle spell is not part of the report
            tally.batches += 1
            tally.steps += len(items)
            tally.largest = max(tally.largest, len(items))
            tally.run_s += now - began
            tally.wait_s += began - dispatched
            if now - tally.since >= REPORT_S:
                log.info("%s", tally.line(self.name, now))
                self.tally = BatchTally(since=now)

    def _take(self) -> list[_Step[ItemT, ResultT]]:
        """The next batch: the `max_batch` live steps due first, in the order they were asked
        for (a stable sort: steps due at once go first come, first served)."""
        live = [step for step in self._queue if not step.waiter.done()]
        if len(live) <= self.max_batch:
            self._queue = []
            return live
        by_due = sorted(range(len(live)), key=lambda index: live[index].due)
        chosen = sorted(by_due[: self.max_batch])
        self.overtakes += sum(1 for index in chosen if index >= self.max_batch)
        taken = set(chosen)
        self._queue = [step for index, step in enumerate(live) if index not in taken]
        return [live[index] for index in chosen]

    def _gathered(self) -> bool:
        """Enough steps wait to choose a batch: a batch's worth (or every member's, if fewer);
        every member's when steps carry deadlines, since the choice is among all of them."""
        timed = any(step.timed for step in self._queue)
        wanted = self._members if timed else min(self._members, self.max_batch)
        return len(self._queue) >= wanted

    async def _regroup(self) -> None:
        """Wait up to `regroup_s` until the members have asked for their steps (`_gathered`)."""
        if self._gathered():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.regroup_s):
                while not self._gathered():
                    self._arrived.clear()
                    await self._arrived.wait()


def _fail(steps: list[_Step[ItemT, ResultT]], error: Exception) -> None:
    for step in steps:
        if not step.waiter.done():
            step.waiter.set_exception(error)
