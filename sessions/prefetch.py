"""An answer begun at the turn's pause, before the turn is known to have ended.

Once the words up to a pause are recognised, the answer to them can start: the Thinker
reads them, the Talker and Code2Wav follow, while the rest of the silence window passes. If
the turn ends where the pause began, the response adopts this work, and its first text and
audio are out at once, or sooner than a start from scratch; if the user speaks on, the work
is thrown away (the pipeline request is aborted in every stage), and nothing of it ever
reached the client.

The words may be a quick recogniser's draft (turn_transcript.py): the final words of record
come a little later. The same words (case and punctuation aside) keep the answer begun on
the draft; other words begin it again on them (`PrefetchSlot.start`), and a response that
adopts an answer checks its words against the final ones first (responder.py), so an answer
to words the user did not say is never heard.

A `Prefetch` owns one task that builds the request and pumps the pipeline's chunks into a
bounded queue (a full queue holds the pipeline back). `stream()` hands them on to the
adopting response; `discard()` cancels and awaits the task. Both are safe in any order,
any number of times. A session holds at most one at a time in its `PrefetchSlot`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing

from prometheus_client import Counter

from pipeline.tasks import TaskSet
from pipeline.types import OutputChunk, Pipeline, PipelineRequest
from pipeline.word_match import same_words

QUEUE_CHUNKS = 256


class Prefetch:
    def __init__(
        self,
        pipeline: Pipeline,
        build: Callable[[], Awaitable[PipelineRequest]],
        *,
        item_id: str,
        end_ms: int,
        name: str,
        words: str = "",
    ) -> None:
        """Start at once: build the request, then generate. `item_id`/`end_ms`: the turn
        and the end of its speech that this answer answers; `words`: what it answers."""
        self.item_id = item_id
        self.end_ms = end_ms
        self.words = words
        self._pipeline = pipeline
        self._request: asyncio.Future[PipelineRequest] = asyncio.get_running_loop().create_future()
        self._queue: asyncio.Queue[OutputChunk | BaseException | None] = asyncio.Queue(QUEUE_CHUNKS)
        self._pumping = TaskSet(name)
        """Owns the pump; `discard()` closes it."""
        self._pumping.create_task(self._pump(build), name=name)

    def matches(self, item_id: str, end_ms: int) -> bool:
        """Whether this is the answer to the turn `item_id` ending at `end_ms`."""
        return (self.item_id, self.end_ms) == (item_id, end_ms)

    async def request(self) -> PipelineRequest:
        """The request it answers (once built; raises what building raised)."""
        return await asyncio.shield(self._request)

    async def stream(self) -> AsyncGenerator[OutputChunk, None]:
        """The answer's chunks, those already made first. Closing it discards the work."""
        try:
            while True:
                item = await self._queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            await self.discard()

    async def discard(self) -> None:
        """Abort the work (the pipeline request in every stage) and wait for it."""
        await self._pumping.close()
        if not self._request.done():
            self._request.cancel()
        elif not self._request.cancelled():
            self._request.exception()  # seen: a build that failed is no unhandled error

    async def _pump(self, build: Callable[[], Awaitable[PipelineRequest]]) -> None:
        try:
            request = await build()
        except Exception as exc:
            self._request.set_exception(exc)
            return
        self._request.set_result(request)
        try:
            async with aclosing(self._pipeline.generate(request)) as chunks:
                async for chunk in chunks:
                    await self._queue.put(chunk)
        except Exception as exc:  # the adopting response reports it
            await self._queue.put(exc)
            return
        await self._queue.put(None)


class PrefetchSlot:
    """A session's one answer begun ahead: a new one replaces the old, which is discarded
    (unless it answers the same words of the same pause); each ends counted as kept
    (adopted by the response) or discarded."""

    def __init__(self, outcomes: Counter) -> None:
        self._outcomes = outcomes
        self._current: Prefetch | None = None

    async def start(
        self,
        pipeline: Pipeline,
        build: Callable[[], Awaitable[PipelineRequest]],
        *,
        item_id: str,
        end_ms: int,
        name: str,
        words: str = "",
    ) -> None:
        current = self._current
        same = current is not None and current.matches(item_id, end_ms)
        if same and current is not None and same_words(current.words, words):
            return  # the final words are the draft's: the answer begun on it stands
        await self.drop()
        self._current = Prefetch(
            pipeline, build, item_id=item_id, end_ms=end_ms, name=name, words=words
        )

    async def take(self, item_id: str, end_ms: int) -> Prefetch | None:
        """The answer begun at the pause where the turn `item_id` ended (`end_ms`), or None
        (and whatever was begun is discarded)."""
        current = self._current
        if current is not None and current.matches(item_id, end_ms):
            self._current = None
            return current
        await self.drop()
        return None

    async def settle(self, taken: Prefetch, words: str | None) -> Prefetch | None:
        """The answer `taken` if it answers the turn's final `words` (None: no final words
        came, and its own stand), counted kept; else it is discarded (begun on a draft that
        the final words overrule), counted redone, and None."""
        if words is None or same_words(taken.words, words):
            self._outcomes.labels("kept").inc()
            return taken
        self._outcomes.labels("redone").inc()
        await taken.discard()
        return None

    async def drop(self) -> None:
        """Discard the answer begun ahead, if any. Idempotent."""
        current, self._current = self._current, None
        if current is not None:
            self._outcomes.labels("discarded").inc()
            await current.discard()
