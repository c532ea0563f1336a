"""A pipeline of one stage: the engine's output chunks go straight to the caller.

This is the smallest graph. It holds the pipeline contract for a single entry engine: the
stream ends with one End or ErrorChunk, and closing it early aborts the request.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from .capacity import PipelineCapacity, StageCapacity
from .streamed_entry import PassesStreamedTurns, turn_engine
from .types import (
    AudioChunk,
    End,
    EntryEngine,
    ErrorChunk,
    OutputChunk,
    PipelineRequest,
    StreamingInput,
    TextDelta,
    ToolCallDelta,
)


class EnginePipeline(PassesStreamedTurns):
    def __init__(self, engine: EntryEngine, name: str | None = None) -> None:
        self.engine = engine
        self.name = name or engine.name

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    def active_requests(self) -> int:
        return self.engine.active_requests()

    async def forget_session(self, session_id: str) -> None:
        await self.engine.forget_session(session_id)

    def _turn_engine(self) -> StreamingInput | None:
        return turn_engine(self.engine)

    def capacity(self) -> PipelineCapacity | None:
        stated = self.engine.capacity()
        if stated is None:
            return None
        return PipelineCapacity.of([StageCapacity(stated, self.engine.shared_by_processes())])

    async def generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]:
        stream = self.engine.generate(request.request_id, request)
        finished = False
        try:
            async for chunk in stream:
                if isinstance(chunk, TextDelta | ToolCallDelta | AudioChunk):
                    yield chunk
                elif isinstance(chunk, End | ErrorChunk):
                    finished = True
                    yield chunk
                    return
            finished = True
            yield ErrorChunk(message="the engine stopped without an end marker", stage=self.name)
        except Exception as exc:  # an engine bug must reach the caller as an error chunk
            finished = True
            yield ErrorChunk(message=f"{type(exc).__name__}: {exc}", stage=self.name)
        finally:
            await stream.aclose()
            if not finished:
                await self.engine.abort(request.request_id)
