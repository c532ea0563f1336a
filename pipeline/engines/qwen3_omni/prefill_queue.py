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
fails only its own request.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...tasks import cancel_and_wait
from .model_thread import ModelThread
from .thinker_runner import (
    PrefillJob,
    ThinkerHidden,
    ThinkerPast,
    ThinkerPrompt,
    ThinkerRunner,
    ThinkerState,
)

Prefilled = tuple[ThinkerPrompt, ThinkerState, ThinkerHidden]


@dataclass(frozen=True, slots=True)
class _Waiting:
    prompt: ThinkerPrompt
    past: ThinkerPast | None
    waiter: asyncio.Future[Prefilled]


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
        self._waiting: list[_Waiting] = []
        self._lock = threading.Lock()
        """`_waiting` is added to on the event loop and taken from on the model thread."""
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.prep_threads = max(1, prep_threads)
        self.gather_s = gather_s
        self._building = 0
        """prompts on the prep threads now: the next batch waits a moment for them"""
        self._prep: ThreadPoolExecutor | None = None

    def start(self) -> None:
        if self._task is None:
            self._prep = ThreadPoolExecutor(
                self.prep_threads, thread_name_prefix=f"{self.name}-prep"
            )
            self._task = asyncio.create_task(self._dispatch(), name=f"{self.name}:prefill")

    async def close(self) -> None:
        """Stop; prefills still waiting fail. Idempotent."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        prep, self._prep = self._prep, None
        if prep is not None:
            await asyncio.to_thread(prep.shutdown, wait=True, cancel_futures=True)
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for entry in waiting:
            if not entry.waiter.done():
                entry.waiter.set_exception(RuntimeError(f"{self.name} is closed"))

    async def prefill(
        self, build: Callable[[], ThinkerPrompt], past: ThinkerPast | None
    ) -> Prefilled:
        """Prefill the prompt `build` makes (on a prep thread) after `past`."""
        if self._task is None or self._prep is None:
            raise RuntimeError(f"{self.name} is not running")
        loop = asyncio.get_running_loop()
        self._building += 1
        try:
            prompt = await loop.run_in_executor(self._prep, build)
        finally:
            self._building -= 1
            self._arrived.set()
        waiter: asyncio.Future[Prefilled] = loop.create_future()
        with self._lock:
            self._waiting.append(_Waiting(prompt, past, waiter))
        self._arrived.set()
        return await waiter

    def _take(self) -> tuple[list[_Waiting], PrefillJob | None]:
        """On the model thread: the prompts waiting now (up to `max_batch`), begun as one."""
        with self._lock:
            taken = self._waiting[: self.max_batch]
            self._waiting = self._waiting[self.max_batch :]
        taken = [entry for entry in taken if not entry.waiter.cancelled()]
        if not taken:
            return [], None
        job = self.runner.prefill_job(
            [(entry.prompt, entry.past) for entry in taken], chunk_tokens=self.chunk_tokens
        )
        job.batch.begin()
        return taken, job

    async def _dispatch(self) -> None:
        while True:
            while not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            await self._gather()
            taken: list[_Waiting] = []
            try:
                taken, job = await self.thread.call(self._take)
                if job is None:
                    continue
                self.largest_batch = max(self.largest_batch, len(taken))
                self.batches += 1
                while not job.batch.done:
                    await self.thread.call(job.batch.run_chunk)
                results = await self.thread.call(
                    self.runner.finish_prefill, job, min_new_tokens=self.min_new_tokens
                )
            except asyncio.CancelledError:
                for entry in taken:  # closed mid-batch: nobody will answer them now
                    if not entry.waiter.done():
                        entry.waiter.set_exception(RuntimeError(f"{self.name} is closed"))
                raise
            except Exception as exc:
                await self._one_at_a_time(taken, exc)
                continue
            for entry, (state, hidden) in zip(taken, results, strict=True):
                if not entry.waiter.done():
                    entry.waiter.set_result((entry.prompt, state, hidden))

    async def _gather(self) -> None:
        """Wait up to `gather_s` while prompts are still being built for a batch with room."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.gather_s):
                while self._building and len(self._waiting) < self.max_batch:
                    self._arrived.clear()
                    await self._arrived.wait()

    async def _one_at_a_time(self, taken: list[_Waiting], error: Exception) -> None:
        """After a batch failed: each prompt alone, so that only a bad one fails."""
        if len(taken) <= 1:
            for entry in taken:
                if not entry.waiter.done():
                    entry.waiter.set_exception(error)
            return
        for entry in taken:
            if entry.waiter.done():
                continue
            prompt = entry.prompt
            try:
                state, hidden = await self.thread.call(
                    self.runner.prefill, prompt, min_new_tokens=self.min_new_tokens, past=entry.past
                )
            except Exception as exc:
                if not entry.waiter.done():
                    entry.waiter.set_exception(exc)
            else:
                if not entry.waiter.done():
                    entry.waiter.set_result((prompt, state, hidden))
