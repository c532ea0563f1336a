"""`gpu_sharing: mps`: the MPS daemon a graph's stage processes share a GPU through.

The real control tool needs an NVIDIA GPU; here `tests/fakes/mps_control.py` stands in for it
with the same contract (a daemon per pipe directory, `quit` on standard input). What a real
daemon does to its clients when one of them fails (they all fail) is not faked: the tests
check what Parley does about it (every stage restarted under a fresh daemon)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.gpu_sharing import LOG_ENV, PIPE_ENV, GpuSharingError, MpsDaemon, sweep_stale
from pipeline.graph import StageGraph
from pipeline.graph_config import GraphConfigError, parse_graph
from pipeline.registry import load_pipeline
from pipeline.types import End, PipelineRequest
from pipeline.worker import WorkerEngine
from tests.fakes import mps_control

GRAPH = """\
name: shared_gpu
gpu_sharing: mps
stages:
  - name: echo
    engine: echo
    placement: {process: worker}
outputs: [echo]
"""


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def environment(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def daemon_pid(pipe_dir: str) -> int:
    return int((Path(pipe_dir) / mps_control.PID_FILE).read_text())


@pytest.fixture
def tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake control tool first on PATH, no MPS daemon named in the environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(PIPE_ENV, raising=False)
    monkeypatch.delenv(LOG_ENV, raising=False)
    yield mps_control.install(bin_dir)
    assert PIPE_ENV not in os.environ, "a daemon's pipe directory was left in the environment"


def test_the_daemon_serves_the_processes_started_after_it_and_close_quits_it(tool: Path) -> None:
    daemon = MpsDaemon()
    daemon.start()
    daemon.start()  # idempotent: still one daemon
    assert daemon.owned and daemon.pipe_dir is not None
    pid = daemon_pid(daemon.pipe_dir)
    assert running(pid)
    child = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.environ['{PIPE_ENV}'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == daemon.pipe_dir
    root = Path(daemon.pipe_dir).parent
    daemon.close()
    daemon.close()
    assert not running(pid)
    assert not root.exists()


def test_without_the_control_tool_start_says_what_to_install_or_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(PIPE_ENV, raising=False)
    with pytest.raises(GpuSharingError, match="nvidia-cuda-mps-control.*gpu_sharing: none"):
        MpsDaemon().start()


def test_a_daemon_that_will_not_start_leaves_nothing_behind(
    tool: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAKE_MPS_REFUSE", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read afresh
    with pytest.raises(GpuSharingError, match="did not start.*already running"):
        MpsDaemon().start()
    assert not list(tmp_path.glob("parley-mps-*"))


def test_an_operators_daemon_is_used_and_left_running(
    tool: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe = tmp_path / "operators"
    pipe.mkdir()
    env = {**os.environ, PIPE_ENV: str(pipe)}
    subprocess.run([str(tool), "-d"], env=env, check=True)
    monkeypatch.setenv(PIPE_ENV, str(pipe))
    try:
        daemon = MpsDaemon()
        daemon.start()
        assert daemon.pipe_dir == str(pipe) and not daemon.owned
        daemon.close()
        assert running(daemon_pid(str(pipe)))
    finally:
        subprocess.run([str(tool)], input=b"quit\n", env=env, check=True)
        monkeypatch.delenv(PIPE_ENV)


async def test_a_graph_starts_its_daemon_before_its_workers_and_quits_it_on_close(
    tool: Path, tmp_path: Path
) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text(GRAPH)
    graph = load_pipeline(str(path))
    assert isinstance(graph, StageGraph) and graph.gpu is not None
    await graph.start()
    try:
        pipe_dir = graph.gpu.pipe_dir
        assert pipe_dir is not None
        pid = daemon_pid(pipe_dir)
        worker = graph.engines["echo"]
        assert isinstance(worker, WorkerEngine) and worker._process is not None
        assert f"{PIPE_ENV}={pipe_dir}".encode() in environment(worker._process.pid)
    finally:
        await graph.close()
    assert not running(pid)


async def test_a_graph_whose_daemon_cannot_start_starts_no_stage(
    tool: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_REFUSE", "1")
    path = tmp_path / "graph.yaml"
    path.write_text(GRAPH)
    graph = load_pipeline(str(path))
    assert isinstance(graph, StageGraph)
    with pytest.raises(GpuSharingError):
        await graph.start()
    worker = graph.engines["echo"]
    assert isinstance(worker, WorkerEngine) and worker._process is None
    await graph.close()


def test_a_graph_without_gpu_sharing_or_with_only_remote_stages_starts_no_daemon() -> None:
    plain = load_pipeline("echo")
    assert isinstance(plain, StageGraph) and plain.gpu is None
    remote = parse_graph(GRAPH.replace("{process: worker}", "{process: remote}"))
    from pipeline.registry import gpu_sharing

    assert gpu_sharing(remote) is None
    assert gpu_sharing(parse_graph(GRAPH)) is not None
    assert gpu_sharing(parse_graph(GRAPH), shared={"echo": "/tmp/x.sock"}) is None


def test_an_unknown_gpu_sharing_names_its_line() -> None:
    with pytest.raises(GraphConfigError, match=r"g.yaml:2: gpu_sharing: Input should be"):
        parse_graph(GRAPH.replace("gpu_sharing: mps", "gpu_sharing: fast"), "g.yaml")


TWO_STAGES = """\
name: shared_gpu_two
gpu_sharing: mps
stages:
  - name: first
    engine: echo
    placement: {process: worker}
  - name: second
    engine: echo
    placement: {process: worker}
outputs: [first, second]
"""


async def test_a_stage_that_dies_under_mps_restarts_every_stage_under_a_fresh_daemon(
    tool: Path, tmp_path: Path
) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text(TWO_STAGES)
    graph = load_pipeline(str(path))
    assert isinstance(graph, StageGraph) and graph.gpu is not None
    await graph.start()
    try:
        first, second = graph.engines["first"], graph.engines["second"]
        assert isinstance(first, WorkerEngine) and isinstance(second, WorkerEngine)
        old_pipe, old_pids = graph.gpu.pipe_dir, (first.pid, second.pid)
        assert old_pipe is not None and None not in old_pids
        old_daemon = daemon_pid(old_pipe)
        os.kill(old_pids[0] or 0, signal.SIGKILL)  # a client of the daemon dies
        async with asyncio.timeout(30):
            while (
                first.pid in (None, old_pids[0])
                or second.pid in (None, old_pids[1])
                or graph.stalled_stages()
            ):
                await asyncio.sleep(0.05)
        assert not running(old_daemon)
        new_pipe = graph.gpu.pipe_dir
        assert new_pipe is not None and new_pipe != old_pipe and running(daemon_pid(new_pipe))
        for worker in (first, second):
            assert worker.pid is not None
            assert f"{PIPE_ENV}={new_pipe}".encode() in environment(worker.pid)
        assert second.last_exit == -signal.SIGKILL  # stopped for the daemon, not by itself
        request = PipelineRequest("resp_after", np.zeros(160, dtype=np.int16), text="hi")
        out = [chunk async for chunk in graph.generate(request)]
        assert isinstance(out[-1], End)
        new_daemon = daemon_pid(new_pipe)
    finally:
        await graph.close()
    assert not running(new_daemon)


def test_a_daemon_left_by_a_killed_server_is_quit_at_the_next_start(
    tool: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server killed outright leaves its daemon; the next start quits it, and leaves the
    daemon of a server still running alone."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read afresh
    killed = subprocess.run(  # a server that started its daemon, then was SIGKILLed
        [
            sys.executable,
            "-c",
            "import os, signal; from pipeline.gpu_sharing import MpsDaemon; d = MpsDaemon(); "
            "d.start(); print(d.pipe_dir, flush=True); os.kill(os.getpid(), signal.SIGKILL)",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert killed.returncode == -signal.SIGKILL
    stale_pipe = killed.stdout.strip()
    stale_daemon = daemon_pid(stale_pipe)
    assert running(stale_daemon)
    live = MpsDaemon()  # a live server's daemon is left alone
    live.start()
    try:
        assert not running(stale_daemon)
        assert not Path(stale_pipe).parent.exists()
        assert "left by process" in caplog.text and "which is gone; quitting it" in caplog.text
        assert live.pipe_dir is not None
        assert sweep_stale(str(tool)) == []
        assert running(daemon_pid(live.pipe_dir))
    finally:
        live.close()
