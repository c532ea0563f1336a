"""A graph's capacity: its stages' figures, wherever each stage runs (this process, a worker
process, replicas), and the sessions the whole graph serves across server processes."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from pipeline.capacity import Capacity, PipelineCapacity, RowLoad, StageCapacity
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.replicas import StageReplicas
from pipeline.worker import WorkerEngine
from tests.fakes.stage_engines import Rowed

ROWED = "tests.fakes.stage_engines:Rowed"


def graph_text(process: str) -> str:
    return f"""\
name: rowed
stages:
  - name: duplex
    engine: "{ROWED}"
    engine_args: {{rows: 3, holds: session}}
    placement: {{process: {process}}}
  - name: thinker
    engine: "{ROWED}"
    engine_args: {{rows: 2, holds: turn, waiting: 2}}
outputs: [duplex, thinker]
"""


async def test_a_stage_in_a_worker_process_states_its_capacity_in_the_main_process() -> None:
    config = parse_graph(graph_text("worker"))
    engines = build_engines(config)
    graph = StageGraph(config, engines)
    await graph.start()
    try:
        assert isinstance(engines["duplex"], WorkerEngine)
        capacity = graph.capacity()
        assert capacity is not None
        by_stage = {stage.capacity.stage: stage for stage in capacity.stages}
        assert by_stage["duplex"].capacity.rows == 3  # said over the link, named by the graph
        assert by_stage["duplex"].capacity.holds == "session"
        assert by_stage["thinker"].capacity.sessions == 4  # 2 rows and 2 waiting turns
        assert capacity.sessions == 3
        assert capacity.across(2) == 6  # each server process runs its own copies
        assert "duplex: 3 cache rows of 4,096 positions, one per session" in capacity.lines()[0]
        async with asyncio.timeout(10):  # its rows come with its heartbeat, for the metrics
            while engines["duplex"].row_load() is None:
                await asyncio.sleep(0.05)
        assert engines["duplex"].row_load() == RowLoad(0, 0, 0)
        scraped = generate_latest(graph.metrics.registry).decode()
        assert 'parley_stage_rows_in_use{stage="duplex"} 0.0' in scraped
    finally:
        await graph.close()


def test_replicas_sum_their_rows() -> None:
    replicas = StageReplicas("thinker", [Rowed(2, "turn", 1), Rowed(2, "turn", 1)], ["a", "b"])
    stated = replicas.capacity()
    assert stated is not None
    assert (stated.rows, stated.waiting, stated.sessions) == (4, 2, 6)


def test_a_stage_shared_by_every_server_process_counts_once() -> None:
    own = StageCapacity(Capacity("code", 10, 100, "session"))
    shared = StageCapacity(Capacity("thinker", 8, 100, "turn", waiting=8), shared=True)
    capacity = PipelineCapacity.of([own, shared])
    assert capacity is not None
    assert capacity.sessions == 10
    assert capacity.across(4) == 16  # the shared Thinker's 16, not 4 x 16
    assert PipelineCapacity.of([]) is None
