"""The duplex engine as a stage of a graph file (`engine: moshi.duplex`).

A graph's stages answer requests; a duplex model answers none: it is reached through a
stream per session (pipeline/duplex.py), which the transports open. As a stage it loads
and captures the model with the graph (so `/readyz` waits for it), ends every stream when
the graph closes, and answers a request, should anything send one, with an error saying
how the model is used. Streams are keyed by their connection, not by session (a stream is
opened before its session exists, so a full model costs no session), and the connection
ends its own: the default `forget_session` has nothing to drop.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from ...capacity import Capacity
from ...types import Chunk, EntryEngine, ErrorChunk, PipelineRequest
from .duplex_engine import MoshiDuplexEngine
from .frame_step import Sampling

NOT_A_TURN = (
    "this model is full duplex: it listens and speaks continuously over a duplex session "
    "(GPT-Live at /v1/live/sessions) and takes no requests"
)


class MoshiStage(EntryEngine):
    name = "moshi.duplex"

    def __init__(self, *, greedy: bool = False, **options: Any) -> None:
        """`options`: MoshiDuplexEngine's (tiny, device, dtype, model_path, rows,
        stall_s, stuck_s, restart_s); `greedy` picks the likeliest token (tests) instead of
        sampling."""
        self.duplex = MoshiDuplexEngine(**options, sampling=Sampling(greedy=greedy))

    async def start(self) -> None:
        await self.duplex.start()
        logging.getLogger("parley.pipeline.moshi").info("%s", self.capacity().line())

    def capacity(self) -> Capacity:
        """A row of its caches per session, for the session's whole life."""
        context, memory = self.duplex.cache_figures()
        return Capacity(self.name, self.duplex.rows, context, "session", memory_bytes=memory)

    async def generate(
        self, request_id: str, request: PipelineRequest, /
    ) -> AsyncGenerator[Chunk, None]:
        yield ErrorChunk(NOT_A_TURN, self.name)

    async def abort(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        await self.duplex.close()

    def active_requests(self) -> int:
        return 0  # streams are not requests: the sessions hold them

    def stalled(self, bound_s: float) -> str | None:
        """The clock died or has stalled (`/readyz` names it): duplex_engine.py."""
        return self.duplex.stalled(bound_s)

    def describe(self) -> dict[str, Any]:
        stats = self.duplex.stats
        return {
            "sessions": self.duplex.sessions,
            "late_steps": stats.late_steps,
            "failed_steps": stats.failed_steps,
            "failed_sessions": stats.failed_sessions,
            "clock_restarts": self.duplex.restarts,
        }
