"""A stage with replicas on several devices: sessions spread over them and stay on theirs.

The choice is tested on its own (`ReplicaChooser`), then through a real stage graph: replicas
in this process, given their devices by the graph file, and replicas in worker processes of
their own. `WhereAmI` answers with its device, its process and the sessions it keeps.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.replicas import ReplicaChooser, StageReplicas
from pipeline.types import End, PipelineRequest, TextDelta
from pipeline.worker import WorkerEngine
from tests.fakes.stage_engines import WhereAmI
from tests.pipeline.test_worker import started


def test_sessions_spread_evenly_and_stay_on_their_replica() -> None:
    chooser = ReplicaChooser(2)
    first = [chooser.choose(s, [0, 0])[0] for s in ("a", "b", "c", "d")]
    assert first == [0, 1, 0, 1]
    # later turns come back to the same replica, however busy it is now
    assert [chooser.choose(s, [9, 0])[0] for s in ("a", "c")] == [0, 0]
    assert (chooser.sessions_on(0), chooser.sessions_on(1)) == (2, 2)


def test_a_request_without_a_session_goes_to_the_least_busy_replica() -> None:
    chooser = ReplicaChooser(3)
    assert chooser.choose("", [2, 0, 1]) == (1, None)
    assert chooser.placed("") is None
    assert [chooser.sessions_on(r) for r in range(3)] == [0, 0, 0]


def test_a_new_session_avoids_a_replica_that_is_down() -> None:
    chooser = ReplicaChooser(2)
    assert chooser.choose("a", [0, 0], down=[0]) == (1, None)
    assert chooser.choose("b", [0, 0], down=[0]) == (1, None)


def test_a_session_whose_replica_went_down_moves_and_says_from_where() -> None:
    chooser = ReplicaChooser(2)
    assert chooser.choose("a", [0, 0]) == (0, None)
    assert chooser.choose("a", [0, 0], down=[0]) == (1, 0)
    assert (chooser.sessions_on(0), chooser.sessions_on(1)) == (0, 1)
    # the first replica back up: the session stays where its state now is
    assert chooser.choose("a", [0, 0]) == (1, None)


def test_with_every_replica_down_a_session_stays_put() -> None:
    chooser = ReplicaChooser(2)
    chooser.choose("a", [0, 0])
    assert chooser.choose("a", [0, 0], down=[0, 1]) == (0, None)


def test_forgetting_a_session_frees_its_place() -> None:
    chooser = ReplicaChooser(2)
    chooser.choose("a", [0, 0])
    chooser.choose("b", [0, 0])
    assert chooser.forget("a") == 0
    assert chooser.forget("a") is None
    assert chooser.choose("c", [0, 0]) == (0, None)  # replica 0 had the room


def test_the_table_of_places_is_bounded() -> None:
    chooser = ReplicaChooser(2, max_sessions=3)
    for s in "abcde":
        chooser.choose(s, [0, 0])
    assert chooser.placed("a") is None and chooser.placed("b") is None
    assert chooser.sessions_on(0) + chooser.sessions_on(1) == 3


def test_a_busy_list_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="2 replicas"):
        ReplicaChooser(2).choose("a", [0])


def _graph(process: str) -> str:
    return f"""\
name: replicas
stages:
  - name: where
    engine: "tests.fakes.stage_engines:WhereAmI"
    placement: {{process: {process}, devices: ["cuda:0", "cuda:1"]}}
outputs: [where]
"""


async def ask(graph: StageGraph, session: str, rid: str) -> tuple[str, str, set[str]]:
    """(device, pid, sessions kept there) as the replica that served the request says."""
    request = PipelineRequest(request_id=rid, audio=np.zeros(0, np.int16), session_id=session)
    out = [c async for c in graph.generate(request)]
    assert isinstance(out[-1], End), out
    words = "".join(c.text for c in out if isinstance(c, TextDelta)).split(" ")
    return words[0], words[1], set(filter(None, words[2].split(",")))


@pytest.mark.parametrize("process", ["main", "worker"])
async def test_each_replica_runs_on_its_device_and_a_session_keeps_its_replica(
    process: str,
) -> None:
    async with started(_graph(process)) as graph:
        stage = graph.engines["where"]
        assert isinstance(stage, StageReplicas)
        assert stage.devices == ["cuda:0", "cuda:1"]
        if process == "worker":
            assert all(isinstance(r, WorkerEngine) for r in stage.replicas)
        a1 = await ask(graph, "sess_a", "r1")
        b1 = await ask(graph, "sess_b", "r2")
        a2 = await ask(graph, "sess_a", "r3")
        b2 = await ask(graph, "sess_b", "r4")
        assert (a1[0], b1[0]) == ("cuda:0", "cuda:1")  # the graph file's devices, one each
        assert a2[:2] == a1[:2] and b2[:2] == b1[:2]  # the same replica, turn after turn
        if process == "worker":
            assert a1[1] != b1[1]  # two worker processes
        assert a2[2] == {"sess_a"} and b2[2] == {"sess_b"}  # no replica saw the other's
        await graph.forget_session("sess_a")
        c1 = await ask(graph, "sess_c", "r5")
        assert c1[0] == "cuda:0"  # the room sess_a left
        assert c1[2] == {"sess_c"}  # its replica dropped what it kept for sess_a
        assert graph.active_requests() == 0


async def test_an_aborted_request_is_aborted_on_its_replica() -> None:
    async with started(_graph("main")) as graph:
        stage = graph.engines["where"]
        assert isinstance(stage, StageReplicas)
        request = PipelineRequest(
            request_id="held", audio=np.zeros(0, np.int16), session_id="s", text="hold"
        )
        stream = graph.generate(request)
        first = await anext(stream)
        assert isinstance(first, TextDelta)
        assert stage.requests_on(0) == 1 and stage.active_requests() == 1
        await stream.aclose()
        assert stage.requests_on(0) == 0 and stage.active_requests() == 0


class _Replica(WhereAmI):
    def __init__(self, device: str, fail: bool) -> None:
        super().__init__(device)
        self.fail = fail
        self.closed = 0

    async def start(self) -> None:
        if self.fail:
            raise RuntimeError(f"no memory left on {self.device}")

    async def close(self) -> None:
        self.closed += 1
        await super().close()


async def test_a_replica_that_fails_to_start_stops_the_others_with_its_reason() -> None:
    good, bad = _Replica("cuda:0", fail=False), _Replica("cuda:1", fail=True)
    stage = StageReplicas("where", [good, bad], ["cuda:0", "cuda:1"])
    with pytest.raises(RuntimeError, match="no memory left on cuda:1"):
        await stage.start()
    assert (good.closed, bad.closed) == (1, 1)
    await stage.close()  # idempotent
    assert (good.closed, bad.closed) == (1, 1)


def test_engine_arguments_a_replica_cannot_take_are_an_error_at_build() -> None:
    text = """\
name: replicas
stages:
  - name: where
    engine: "tests.fakes.stage_engines:WhereAmI"
    engine_args: {no_such_argument: 1}
    placement: {process: main, devices: ["cuda:0", "cuda:1"]}
outputs: [where]
"""
    with pytest.raises(TypeError, match="no_such_argument"):
        build_engines(parse_graph(text))


def test_stage_hosts_serve_a_replicated_stage_one_host_per_replica() -> None:
    """With `--workers N`, the parent hosts each replica once (web/stage_hosts.py) and every
    server process spreads its sessions over those hosts."""
    config = parse_graph(_graph("worker"))
    engines = build_engines(config, shared={"where": ["/run/a.sock", "/run/b.sock"]})
    stage = engines["where"]
    assert isinstance(stage, StageReplicas)
    assert [type(r).__name__ for r in stage.replicas] == ["SharedStageEngine"] * 2
    single = build_engines(config, shared={"where": "/run/a.sock"})["where"]
    assert type(single).__name__ == "SharedStageEngine"
