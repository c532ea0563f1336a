"""The session cap held to the pipeline's capacity, across the server processes that share
one Redis (`parley serve --workers N`): each process's own stages count once per process, a
stage they all share (a stage host's) once."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from sessions import SessionLimitError, SessionManager
from tests.fakes.sink import ClockedSink
from tests.fakes.stage_engines import Rowed


@pytest.mark.parametrize(("shared", "cap"), [(False, 2), (True, 1)], ids=["own", "shared"])
async def test_two_server_processes_admit_what_their_graphs_serve_together(
    redis: aioredis.Redis, shared: bool, cap: int
) -> None:
    pipelines = [EnginePipeline(Rowed(rows=1, shared=shared)) for _ in range(2)]
    sinks = [ClockedSink() for _ in range(3)]
    async with (
        SessionManager(redis, pipelines[0], max_sessions=64) as a,
        SessionManager(redis, pipelines[1], max_sessions=64) as b,
    ):
        for manager, pipeline in ((a, pipelines[0]), (b, pipelines[1])):
            assert manager.hold_to(pipeline.capacity(), processes=2) == cap
        await a.create(sinks[0])
        if cap == 2:
            await b.create(sinks[1])
        with pytest.raises(SessionLimitError, match=f"all {cap} session slots"):
            await b.create(sinks[2])  # the managers close their sessions on the way out


async def test_a_pipeline_that_states_nothing_keeps_the_configured_cap(
    redis: aioredis.Redis,
) -> None:
    async with SessionManager(redis, EnginePipeline(Rowed()), max_sessions=5) as manager:
        assert manager.hold_to(None, processes=3) == 5
        assert manager.max_sessions == 5
