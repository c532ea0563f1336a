"""A request id used again must not receive what the stage still says about its last use.

A serving side sends `Done` after a request's End; it can reach the main process after the
caller has started the next request with the same id (the omni bench reuses `resp_bench_0`
from one concurrency level to the next). That late `Done` once closed the new request's
stream: code2wav ended it without End and without audio, and the graph took that as done.
The fake serving side here holds the `Done` back until the second request is open.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from pipeline.connectors.inprocess import InProcessLink
from pipeline.link_messages import Abort, ChunkMessage, Done, Generate, Ready
from pipeline.stage_client import LinkedStage
from pipeline.types import Chunk, End, PipelineRequest, TextDelta


class _Stage(LinkedStage):
    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await self._detach()


async def _next_generate(link: InProcessLink) -> Generate:
    """The next Generate the stage is sent (Aborts of finished requests are skipped)."""
    while True:
        message: Any = await link.recv()
        if isinstance(message, Generate):
            return message
        assert isinstance(message, Abort), message


async def _collect(stage: LinkedStage, request: PipelineRequest) -> list[Chunk]:
    chunks = []
    async for chunk in stage.generate(request.request_id, request):
        chunks.append(chunk)
        if isinstance(chunk, End):
            break
    return chunks


async def test_a_late_done_of_a_finished_request_leaves_its_reused_id_alone() -> None:
    main, serving = InProcessLink.pair()
    stage = _Stage("code2wav", start_timeout_s=1.0)
    stage._attach(main)
    await serving.send(Ready())
    request = PipelineRequest(request_id="resp_1", audio=np.zeros(160, dtype=np.int16))
    try:
        first = asyncio.create_task(_collect(stage, request))
        opened = await _next_generate(serving)
        await serving.send(ChunkMessage(opened.request_id, TextDelta("a")))
        await serving.send(ChunkMessage(opened.request_id, End()))
        assert await first == [TextDelta("a"), End()]

        second = asyncio.create_task(_collect(stage, request))
        again = await _next_generate(serving)
        await serving.send(Done(opened.request_id))  # the first use's Done, late
        await asyncio.sleep(0.01)  # the reader routes it
        await serving.send(ChunkMessage(again.request_id, TextDelta("b")))
        await serving.send(ChunkMessage(again.request_id, End()))
        assert await asyncio.wait_for(second, 1.0) == [TextDelta("b"), End()]
        assert stage.active_requests() == 0
    finally:
        await stage.close()
        await serving.close()
