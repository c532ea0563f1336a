"""A stage host: one engine served to several server processes' graphs.

Each graph here stands for one server process of `parley serve --workers N`: it dials the
hosts on its own, as a process of its own would. Both graphs' requests reach the one engine
of each hosted stage (the same request id from both included), a graph that goes away ends
only its own requests, a host that dies fails its requests at once and is dialled again when
it is back, a host that hangs fails them within its hang_s and stops beating to its parent,
and a connection that is not one of ours is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pipeline.graph import StageGraph
from pipeline.graph_config import GraphConfig, parse_graph
from pipeline.registry import build_engines, hosted_stages, worker_spec
from pipeline.shared_stage import SharedStageEngine
from pipeline.stage_host import launch_args
from pipeline.types import AudioChunk, End, ErrorChunk, OutputChunk, TextDelta
from tests.pipeline.test_worker import GRAPH, HANGING, request

CONFIG = parse_graph(GRAPH.replace("delay_s: 0.005", "delay_s: 0.05"))
"""The worker test's graph, its Thinker slower: 40 tokens take 2 s, time to look inside."""
STOPPING = parse_graph(
    GRAPH.replace("delay_s: 0.005", "delay_s: 0.05").replace(
        "placement: {process: worker}\n", "placement: {process: worker}\n    hang_s: 2\n"
    )
)
"""The same, its hosted stages hung after 2 s without progress."""


class Host:
    """A stage host process, started and stopped by the test (its parent)."""

    def __init__(self, stage: str, path: Path, config: GraphConfig = CONFIG) -> None:
        self.stage = stage
        self.path = path
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.pipe: int | None = None
        """The read end of its ready pipe, where it beats once ready."""

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                launch_args(worker_spec(self.config, self.stage), str(self.path), write_fd),
                pass_fds=(write_fd,),
            )
        finally:
            os.close(write_fd)
        said = b""
        while not said.endswith(b"\n"):
            said += os.read(read_fd, 1)
        assert said == b"ready\n"
        os.set_blocking(read_fd, False)
        self.close_pipe()
        self.pipe = read_fd

    def beats(self) -> bytes:
        """What it wrote on its pipe since the last look."""
        assert self.pipe is not None
        try:
            return os.read(self.pipe, 4096)
        except BlockingIOError:
            return b""

    def close_pipe(self) -> None:
        if self.pipe is not None:
            os.close(self.pipe)
            self.pipe = None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        self.close_pipe()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            assert self.proc.wait(10) == 0


def started_hosts(config: GraphConfig, directory: Path) -> Iterator[dict[str, Host]]:
    started = {
        name: Host(name, directory / f"{name}.sock", config) for name in hosted_stages(config)
    }
    try:
        for host in started.values():
            host.start()
        yield started
    finally:
        for host in started.values():
            host.stop()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[dict[str, Host]]:
    yield from started_hosts(CONFIG, tmp_path)


@pytest.fixture
def hanging_hosts(tmp_path: Path) -> Iterator[dict[str, Host]]:
    yield from started_hosts(STOPPING, tmp_path)


STICKING = parse_graph(HANGING)
"""The worker test's hanging graph: one stage, whose engine's step sticks when asked."""


@pytest.fixture
def sticking_host(tmp_path: Path) -> Iterator[dict[str, Host]]:
    yield from started_hosts(STICKING, tmp_path)


@contextlib.asynccontextmanager
async def graph_on(
    hosts: dict[str, Host], config: GraphConfig = CONFIG
) -> AsyncIterator[StageGraph]:
    shared = {name: str(host.path) for name, host in hosts.items()}
    graph = StageGraph(config, build_engines(config, shared=shared))
    await graph.start()
    try:
        yield graph
    finally:
        await graph.close()


def shared(graph: StageGraph, stage: str) -> SharedStageEngine:
    engine = graph.engines[stage]
    assert isinstance(engine, SharedStageEngine)
    return engine


async def collect(stream: AsyncIterator[OutputChunk]) -> list[OutputChunk]:
    return [chunk async for chunk in stream]


async def held_by_host(graph: StageGraph, stage: str, count: int) -> None:
    async with asyncio.timeout(10):
        while await shared(graph, stage).remote_active_requests() != count:
            await asyncio.sleep(0.01)


async def test_two_processes_graphs_share_one_engine_per_hosted_stage(
    hosts: dict[str, Host],
) -> None:
    assert set(hosts) == {"thinker", "code2wav"}
    async with graph_on(hosts) as a, graph_on(hosts) as b:
        first = a.generate(request("resp_same"))
        second = b.generate(request("resp_same"))  # the same id from another process
        heads = [await anext(first), await anext(second)]
        assert all(isinstance(chunk, TextDelta) for chunk in heads)
        await held_by_host(a, "thinker", 2)  # both requests, in the one engine
        outs = [heads[:1] + await collect(first), heads[1:] + await collect(second)]
        for out in outs:
            assert isinstance(out[-1], End)
            assert [c.text for c in out if isinstance(c, TextDelta)] == [
                f"W{i} " for i in range(40)
            ]
            assert [int(c.pcm[0]) for c in out if isinstance(c, AudioChunk)] == list(range(40))
        await held_by_host(b, "code2wav", 0)


async def test_a_process_that_goes_away_ends_only_its_own_requests(
    hosts: dict[str, Host],
) -> None:
    async with graph_on(hosts) as staying:
        kept = staying.generate(request("resp_kept"))
        await anext(kept)
        async with graph_on(hosts) as leaving:
            dropped = leaving.generate(request("resp_dropped"))
            await anext(dropped)
            await held_by_host(staying, "thinker", 2)
            await dropped.aclose()
        await held_by_host(staying, "thinker", 1)  # the host ended the leaver's
        out = await collect(kept)
        assert isinstance(out[-1], End)
        await held_by_host(staying, "thinker", 0)


async def test_a_host_that_dies_fails_its_requests_and_is_dialled_again(
    hosts: dict[str, Host],
) -> None:
    async with graph_on(hosts) as graph:
        thinker = shared(graph, "thinker")
        stream = graph.generate(request("resp_cut"))
        await anext(stream)
        hosts["thinker"].kill()
        async with asyncio.timeout(5):
            out = await collect(stream)
        assert isinstance(out[-1], ErrorChunk) and out[-1].stage == "thinker"
        hosts["thinker"].start()  # the parent would start it again
        async with asyncio.timeout(20):
            while thinker.restarts < 1 or await thinker.remote_active_requests() != 0:
                await asyncio.sleep(0.05)
        again = await collect(graph.generate(request("resp_again")))
        assert isinstance(again[-1], End)


async def test_a_stopped_host_fails_its_requests_within_seconds_and_goes_quiet_to_its_parent(
    hanging_hosts: dict[str, Host],
) -> None:
    host = hanging_hosts["thinker"]
    async with graph_on(hanging_hosts, STOPPING) as graph:
        thinker = shared(graph, "thinker")
        stream = graph.generate(request("resp_stopped"))
        await anext(stream)
        await asyncio.sleep(1.0)
        assert host.beats()  # a byte every half second while it serves
        assert host.proc is not None
        host.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        async with asyncio.timeout(10):
            out = await collect(stream)
        assert time.monotonic() - stopped < 2 + 3
        error = out[-1]
        assert isinstance(error, ErrorChunk) and error.stage == "thinker"
        assert "stopped answering (hung: no word from it for 2 s)" in error.message
        assert "hung: no word" in graph.stalled_stages()["thinker"]
        down = await collect(graph.generate(request("resp_down")))
        assert isinstance(down[-1], ErrorChunk) and "not answering" in down[-1].message
        host.beats()
        await asyncio.sleep(1.0)
        assert host.beats() == b""  # silent: its parent kills it (web/workers.py)
        host.kill()
        host.start()
        async with asyncio.timeout(30):
            while thinker.restarts < 1 or thinker.down_reason is not None:
                await asyncio.sleep(0.05)
        again = await collect(graph.generate(request("resp_again")))
        assert isinstance(again[-1], End) and graph.stalled_stages() == {}


async def test_a_host_whose_engine_is_stuck_says_so_and_goes_quiet_to_its_parent(
    sticking_host: dict[str, Host],
) -> None:
    host = sticking_host["thinker"]
    async with graph_on(sticking_host, STICKING) as graph:
        stream = graph.generate(request("resp_stuck", text="stick"))
        await anext(stream)
        async with asyncio.timeout(10):
            out = await collect(stream)
        error = out[-1]
        assert isinstance(error, ErrorChunk) and error.stage == "thinker"
        assert "(hung: the sticking thread has made no progress for" in error.message
        host.beats()
        await asyncio.sleep(1.0)
        assert host.beats() == b""  # its loop lives, but it no longer vouches for the engine
        assert host.proc is not None and host.proc.poll() is None
        host.kill()


async def test_a_connection_that_is_not_ours_is_dropped_and_serving_goes_on(
    hosts: dict[str, Host],
) -> None:
    path = str(hosts["code2wav"].path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
        stranger.connect(path)
        stranger.sendall(struct.pack("<I", 1 << 30))  # a hello of a gigabyte
        stranger.settimeout(5)
        assert stranger.recv(16) == b""  # hung up on
    async with graph_on(hosts) as graph:
        out = await collect(graph.generate(request("resp_after")))
        assert isinstance(out[-1], End)


def test_an_engine_that_cannot_start_stops_the_host_with_its_reason(tmp_path: Path) -> None:
    spec = worker_spec(CONFIG, "code2wav")
    wrong = type(spec)(spec.stage, spec.engine, "entry", spec.engine_args)  # a stream engine
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.run(
            launch_args(wrong, str(tmp_path / "x.sock"), write_fd),
            pass_fds=(write_fd,),
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as ready:
        assert ready.read() == b""  # never said ready
    assert proc.returncode == 1
    assert b"stage code2wav" in proc.stderr and b"EntryEngine" in proc.stderr
    assert not (tmp_path / "x.sock").exists()
