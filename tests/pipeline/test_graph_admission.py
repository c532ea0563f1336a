"""Where a graph gets one admission for its turns, and how many it lets in (the rules of
`pipeline/graph_admission.py`; its behaviour on a real graph is in
tests/pipeline/qwen3_omni/test_rows_wait.py)."""

from __future__ import annotations

from pipeline.capacity import Capacity, PipelineCapacity, StageCapacity
from pipeline.graph_admission import GraphAdmission


def stage(name: str, rows: int, waiting: int, *, shared: bool = False) -> StageCapacity:
    figures = Capacity(stage=name, rows=rows, context=4096, waiting=waiting, wait_s=10.0)
    return StageCapacity(figures, shared=shared)


def test_the_graph_admits_the_fewest_rows_and_lets_the_rest_of_its_sessions_wait() -> None:
    admission = GraphAdmission.of(
        PipelineCapacity((stage("thinker", 32, 32), stage("talker", 7, 7)))
    )
    assert admission is not None
    assert (admission.gate.rows, admission.gate.waiting) == (7, 7)
    assert admission.bottleneck == "talker"
    assert admission.gate.wait_s == 10.0


def test_no_graph_admission_where_it_would_hold_nothing() -> None:
    assert GraphAdmission.of(None) is None
    assert GraphAdmission.of(PipelineCapacity((stage("thinker", 4, 4),))) is None
    duplex = Capacity(stage="moshi", rows=64, context=3000, holds="session")
    assert GraphAdmission.of(PipelineCapacity((StageCapacity(duplex), stage("x", 4, 4)))) is None
    # stages shared by several server processes: each would admit its own rows
    shared = PipelineCapacity((stage("thinker", 4, 4, shared=True), stage("talker", 4, 4)))
    assert GraphAdmission.of(shared) is None
