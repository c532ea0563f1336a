"""Streamed turns' prefills, gathered into shared batches and run behind the decode steps.

While many users speak, their turns' audio windows finish at different moments
(`streamed_turns.py`). Prefilled one by one, 32 talking users would cost a stream of
single-row prefills; here the parts waiting are gathered for up to `gather_s` (a part is
not urgent: its turn is still being spoken) and prefilled as one batch of up to
`max_batch` rows (`ThinkerRunner.staging_job`: the towers a row at a time, the decoder
layers batched), `chunk_tokens` positions over all rows at a time. A turn whose end has
come (`hurry`) cuts the gathering short.

Decode first: before each chunk, while answers are being decoded, the queue waits for the
next batch of decode steps to run (`StepBatcher.next_batch`), so at most one chunk runs
between two decode batches of the answers in flight, and a chunk waits no longer than
`yield_s` for steps that are not asked for (an answer whose reader is slow). The chunk
bounds what an answer's steps wait for: on a GPU, a few tens of positions of prefill.

A batch that fails fails its parts (their turns are then taken whole); nothing is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ...tasks import TaskSet
from .model_thread import ModelThread
from .step_batcher import StepBatcher
from .thinker_runner import Extension, StagingJob, ThinkerPast, ThinkerRunner
from .waiting_list import WaitingList, answer, fail

Taken = list[tuple[Extension, "asyncio.Future[ThinkerPast]"]]


class StagingQueue:
    def __init__(
        self,
        name: str,
        thread: ModelThread,
        runner: ThinkerRunner,
        *,
        decode: StepBatcher[Any, Any] | None = None,
        max_batch: int = 8,
        chunk_tokens: int = 0,
        gather_s: float = 0.2,
        yield_s: float = 0.05,
    ) -> None:
        if max_batch < 1 or chunk_tokens < 0:
            raise ValueError("max_batch must be at least 1, chunk_tokens at least 0")
        self.name = name
        self.thread = thread
        self.runner = runner
        self.decode = decode
        self.max_batch = max_batch
        self.chunk_tokens = chunk_tokens
        self.gather_s = gather_s
        self.yield_s = yield_s
        self.batches = 0
        self.largest_batch = 0
        """The most parts one batch has prefilled (for tests and logs)."""
        self.chunks_run = 0
        self._waiting: WaitingList[Extension, ThinkerPast] = WaitingList()
        self._hurry = asyncio.Event()
        self._tasks = TaskSet(f"{name}:staging")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = self._tasks.create_task(self._dispatch(), name=f"{self.name}:staging")

    async def close(self) -> None:
        """Stop; parts still waiting fail. Idempotent."""
        self._task = None
        await self._tasks.close()
        self._waiting.fail_all(f"{self.name} is closed")

    async def extend(self, part: Extension) -> ThinkerPast:
        """`part` prefilled in the next batch: its turn's longer past."""
        if self._task is None:
            raise RuntimeError(f"{self.name} is not running")
        return await self._waiting.add(part)

    def hurry(self) -> None:
        """A turn has ended: the next batch goes without gathering (what it waits for may
        not be asked for yet: its audio's features are being computed)."""
        self._hurry.set()
        self._waiting.changed.set()

    async def _dispatch(self) -> None:
        while True:
            await self._waiting.wait()
            await self._gather()
            taken: Taken = self._waiting.take(self.max_batch)
            if not taken:
                continue
            self.batches += 1
            self.largest_batch = max(self.largest_batch, len(taken))
            try:
                job = await self.thread.call(
                    self.runner.staging_job,
                    [part for part, _ in taken],
                    chunk_tokens=self.chunk_tokens,
                )
                while not job.batch.done:
                    if self.decode is not None:
                        await self.decode.next_batch(self.yield_s)
                    await self.thread.call(self._run_chunk, job)
                results = await self.thread.call(self.runner.finish_staging, job)
            except asyncio.CancelledError:
                for _, waiter in taken:
                    fail(waiter, RuntimeError(f"{self.name} is closed"))
                raise
            except Exception as exc:
                for _, waiter in taken:
                    fail(waiter, exc)
                continue
            for (_, waiter), past in zip(taken, results, strict=True):
                answer(waiter, past)

    def _run_chunk(self, job: StagingJob) -> None:
        job.batch.run_chunk()
        self.chunks_run += 1

    async def _gather(self) -> None:
        """Up to `gather_s` for more parts, unless the batch is full or a turn ended."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.gather_s):
                while len(self._waiting) < self.max_batch and not self._hurry.is_set():
                    self._waiting.changed.clear()
                    await self._waiting.changed.wait()
        self._hurry.clear()
