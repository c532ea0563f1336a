"""The Thinker's prefills, gathered: the prompts waiting when the model thread is free go as one
batch, a chunk at a time (`prefill_batch.py`).

Requests that speak at once (a benchmark's round, a room of callers after a pause) ask for
a prefill with what builds their prompt: log-mel features and image patches, CPU work that
runs on a small pool of its own threads (`prep_threads`), side by side and never on the
model thread, where it would hold every session's decode steps (tens of ms for 10 s of
speech and 4 frames). The batch is taken on the model thread when its turn comes, not when
the first request asks, so every prompt ready by then joins it, and a batch waits up to
`gather_s` for prompts still being built; whoever comes later waits for the next batch. A
prompt that cannot be built fails only its own request.

Each chunk is a call of its own on the model thread, so the decode steps of the
sessions already answering (`StepBatcher`) run between two chunks.

A batch that fails is run again one prompt at a time, so that a prompt the model cannot take
fails only its own request. A batch (or a lone prompt) that ran out of device memory is run
again a prompt at a time in chunks a quarter the size (at least `SMALLEST_CHUNK`), after the
allocator's cached blocks go back: on an 80 GB H100 a long conversation's cut prompt (~6,000
positions in one chunk) failed every later turn of its session that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

import torch

from ...tasks import TaskSet
from .model_thread import ModelThread
from .prefill_timeline import PhaseMarks, PrefillTimes, whole
from .thinker_runner import (
    PrefillJob,
    ThinkerHidden,
    ThinkerPast,
    ThinkerPrompt,
    ThinkerRunner,
    ThinkerState,
)
from .waiting_list import WaitingList, answer, fail

SMALLEST_CHUNK = 256
"""Positions: the least a prefill that ran out of memory is retried in."""

Prefilled = tuple[ThinkerPrompt, ThinkerState, ThinkerHidden, PrefillTimes]
Waiting = tuple[ThinkerPrompt, ThinkerPast | None]
Taken = list[tuple[Waiting, "asyncio.Future[Prefilled]"]]
BuiltT = TypeVar("BuiltT")


class PrefillQueue:
    def __init__(
        self,
        name: str,
        thread: ModelThread,
        runner: ThinkerRunner,
        *,
        max_batch: int = 8,
        chunk_tokens: int = 0,
        min_new_tokens: int = 0,
        prep_threads: int = 4,
        gather_s: float = 0.05,
    ) -> None:
        if max_batch < 1 or chunk_tokens < 0:
            raise ValueError("prefill_batch must be at least 1, prefill_chunk_tokens at least 0")
        self.name = name
        self.thread = thread
        self.runner = runner
        self.max_batch = max_batch
        self.chunk_tokens = chunk_tokens
        self.min_new_tokens = min_new_tokens
        self.largest_batch = 0
        """The most prompts one batch has prefilled (for tests and metrics)."""
        self.batches = 0
        self.prep_threads = max(1, prep_threads)
        self.gather_s = gather_s
        self._waiting: WaitingList[Waiting, Prefilled] = WaitingList()
        self._task: asyncio.Task[None] | None = None
        self._tasks = TaskSet(name)
        """Owns the dispatcher (`_task`); `close()` closes it."""
        self._building = 0
        """prompts on the prep threads now: the next batch waits a moment for them"""
        self._prep: ThreadPoolExecutor | None = None

    def start(self) -> None:
        if self._task is None:
            self._prep = ThreadPoolExecutor(
                self.prep_threads, thread_name_prefix=f"{self.name}-prep"
            )
            self._task = self._tasks.create_task(self._dispatch(), name=f"{self.name}:prefill")

    async def close(self) -> None:
        """Stop; prefills still waiting fail. Idempotent."""
        self._task = None
        await self._tasks.close()
        prep, self._prep = self._prep, None
        if prep is not None:
            await asyncio.to_thread(prep.shutdown, wait=True, cancel_futures=True)
        self._waiting.fail_all(f"{self.name} is closed")

    async def prefill(
        self, build: Callable[[], ThinkerPrompt], past: ThinkerPast | None
    ) -> Prefilled:
        """Prefill the prompt `build` makes (on a prep thread) after `past`."""
        return await self.submit(await self.prepare(build), past)

    async def prepare(self, build: Callable[[], BuiltT]) -> BuiltT:
        """What `build` makes on a prep thread (a prompt, and what else its caller decides
        there); a batch being gathered waits for it. `submit` it right after, in the same
        step of the event loop, to join the batch it was waited for."""
        if self._task is None or self._prep is None:
            raise RuntimeError(f"{self.name} is not running")
        self._building += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._prep, build)
        finally:
            self._building -= 1
            self._waiting.changed.set()

    async def submit(self, prompt: ThinkerPrompt, past: ThinkerPast | None) -> Prefilled:
        """Prefill `prompt` after `past` in the next batch."""
        if self._task is None:
            raise RuntimeError(f"{self.name} is not running")
        return await self._waiting.add((prompt, past))

    def _take(self) -> tuple[Taken, PrefillJob | Exception | None, PhaseMarks | None]:
        """On the model thread: the prompts waiting now (up to `max_batch`), begun as one
        (or why they could not be: the entries are never lost with the error), with the
        marks of its phases (`prefill_timeline.py`)."""
        taken = self._waiting.take(self.max_batch)
        if not taken:
            return [], None, None
        marks = PhaseMarks(self.runner.device)
        try:
            job = self.runner.prefill_job(
                [item for item, _ in taken], chunk_tokens=self.chunk_tokens
            )
            job.batch.begin()
        except Exception as exc:
            return taken, exc, marks
        marks.mark()
        return taken, job, marks

    @staticmethod
    def _chunk(job: PrefillJob, marks: PhaseMarks) -> None:
        job.batch.run_chunk()
        marks.mark()

    def _finish(
        self, job: PrefillJob, marks: PhaseMarks
    ) -> tuple[list[tuple[ThinkerState, ThinkerHidden]], PrefillTimes]:
        results = self.runner.finish_prefill(job, min_new_tokens=self.min_new_tokens)
        marks.mark()
        times = marks.times(
            chunks=job.batch.chunks_run, rows=len(results), positions=sum(job.batch.lengths)
        )
        return results, times

    async def _dispatch(self) -> None:
        while True:
            await self._waiting.wait()
            await self._gather()
            taken: Taken = []
            try:
                taken, job, marks = await self.thread.call(self._take)
                if job is None or marks is None:
                    continue
                self.largest_batch = max(self.largest_batch, len(taken))
                self.batches += 1
                if isinstance(job, Exception):
                    raise job
                while not job.batch.done:
                    await self.thread.call(self._chunk, job, marks)
                results, times = await self.thread.call(self._finish, job, marks)
            except asyncio.CancelledError:
                for _, waiter in taken:  # closed mid-batch: nobody will answer them now
                    fail(waiter, RuntimeError(f"{self.name} is closed"))
                raise
            except Exception as exc:
                if self.thread.fatal is not None:  # the device is gone: nothing will run
                    self._waiting.device_lost(taken, exc, self.name)
                    continue
                await self._one_at_a_time(taken, exc)
                continue
            rows = zip(taken, results, job.batch.lengths, strict=True)
            for ((prompt, _), waiter), (state, hidden), new in rows:
                answer(waiter, (prompt, state, hidden, replace(times, row_positions=new)))

    async def _gather(self) -> None:
        """Wait up to `gather_s` while prompts are still being built for a batch with room."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.gather_s):
                while self._building and len(self._waiting) < self.max_batch:
                    self._waiting.changed.clear()
                    await self._waiting.changed.wait()

    async def _one_at_a_time(self, taken: Taken, error: Exception) -> None:
        """After a batch failed: each prompt alone, so that only a bad one fails; after it ran
        out of device memory, in smaller chunks (a lone prompt too)."""
        chunk = self.chunk_tokens
        if isinstance(error, torch.OutOfMemoryError):
            longest = max(len(prompt.input_ids) for (prompt, _), _ in taken)
            chunk = max(SMALLEST_CHUNK, (chunk or longest) // 4)
            await self.thread.call(torch.cuda.empty_cache)  # the retry's room
        elif len(taken) == 1:
            fail(taken[0][1], error)
            return
        for (prompt, past), waiter in taken:
            if waiter.done():
                continue
            taken_at = time.perf_counter()
            try:
                state, hidden = await self.thread.call(
                    self.runner.prefill,
                    prompt,
                    min_new_tokens=self.min_new_tokens,
                    past=past,
                    chunk_tokens=chunk,
                )
            except Exception as exc:
                fail(waiter, exc)
            else:
                new = len(prompt.input_ids) - (past.length + past.staged if past else 0)
                answer(waiter, (prompt, state, hidden, whole(taken_at, new)))
