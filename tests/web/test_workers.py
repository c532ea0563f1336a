"""`parley serve --workers 2` as real processes: one port, two workers, one embedded Redis.

Sessions spread over both workers and the session cap holds across them; /metrics answers
for both; a killed worker is started again (listening only once it is loaded), and the
WebSocket session it held is resumed on the other; SIGTERM on one worker hands its session
over; SIGTERM on the parent drains (WebSockets closed with 1012 at once, a WebRTC call kept
until --drain-s) and exits 0 with every child gone; SIP is in one worker only. A stage host
that hangs fails its turns within seconds with the reason, /readyz names it while it is
down, and the parent kills it and starts another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from loadtest.proc_cpu import cmdline
from loadtest.webrtc_client import Caller
from tests.web.test_cli import Server, alive, children, free_port, servers
from web.settings import SettingsError, parse_settings

__all__ = ["servers"]  # the fixture, used by the tests below

DRAIN_S = 3.0


def launch(servers: list[Server], *options: str, pipeline: str = "echo") -> tuple[Server, int]:
    """`parley serve --workers 2` on a free port, just started (the fixture stops it)."""
    port = free_port()
    root = str(Path(__file__).parents[2])  # a fake engine is imported from tests/
    server = Server(
        "--port", str(port), "--pipeline", pipeline, "--workers", "2", "--drain-s", f"{DRAIN_S:g}",
        *options,
        env={"PYTHONPATH": root},
    )  # fmt: skip
    servers.append(server)
    return server, port


def start(servers: list[Server], *options: str, pipeline: str = "echo") -> tuple[Server, int]:
    """`launch`, then wait until it is ready."""
    server, port = launch(servers, *options, pipeline=pipeline)
    line = server.wait_for_line("Parley is ready", timeout=60)
    assert f":{port}/ (2 workers)" in line
    return server, port


def workers_of(server: Server) -> list[int]:
    return [pid for pid in children(server.proc.pid) if "web.cli" in cmdline(pid)]


def sessions_by_process(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return {
        sample.labels["process"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "parley_active_sessions"
        for sample in family.samples
    }


@contextlib.asynccontextmanager
async def realtime(port: int) -> AsyncIterator[ClientConnection]:
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=parley", proxy=None) as ws:
        yield ws


async def first_event(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(10):
        event: dict[str, Any] = json.loads(await ws.recv())
    return event


async def close_code(ws: ClientConnection) -> int | None:
    """Read until the server closes; its close code."""
    async with asyncio.timeout(5):
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.recv()
    return ws.close_code


async def test_sessions_spread_over_both_workers_under_one_global_cap(
    servers: list[Server],
) -> None:
    _, port = start(servers, "--max-sessions", "16")
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(16):
            ws = await stack.enter_async_context(realtime(port))
            assert (await first_event(ws))["type"] == "session.created"
        deadline = time.monotonic() + 10  # another worker's figures are up to ~2 s old
        while sum((counts := sessions_by_process(port)).values()) != 16:
            assert time.monotonic() < deadline, counts
            await asyncio.sleep(0.2)
        assert len(counts) == 2
        assert all(n > 0 for n in counts.values()), counts  # 1 in 32768 by chance
        for _ in range(4):  # whichever worker each reaches, the cap is the global one
            async with realtime(port) as ws:
                event = await first_event(ws)
                assert event["type"] == "error", event
                assert event["error"]["code"] == "session_limit"


def listeners(port: int) -> int:
    found = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return len(found.splitlines())


def test_a_killed_worker_is_started_again_and_sigterm_stops_everything(
    servers: list[Server], tmp_path: Path
) -> None:
    graph = tmp_path / "slow.yaml"  # a pipeline that takes 2 s to load
    graph.write_text(
        "name: slow\nstages:\n"
        "  - {name: model, engine: 'tests.fakes.fake_engine:FakeEngine',"
        " engine_args: {start_delay_s: 2.0}}\n"
        "outputs: [model]\n"
    )
    server, port = start(servers, pipeline=str(graph))
    first = workers_of(server)
    assert len(first) == 2 and listeners(port) == 2
    everything = children(server.proc.pid)  # the workers and redis-server
    victim = first[0]
    os.kill(victim, signal.SIGKILL)
    server.wait_for_line("starting it again", timeout=10)
    time.sleep(1)
    assert listeners(port) == 1  # the new one is loading: it does not take connections yet
    assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
    server.wait_for_line(") is ready", timeout=30)  # the parent's line
    assert listeners(port) == 2
    now = workers_of(server)
    assert len(now) == 2 and victim not in now and first[1] in now
    labelled = set(sessions_by_process(port))  # the new one's figures, the dead one's (stale)
    assert len(labelled) in (2, 3)
    everything += now
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(15) == 0
    deadline = time.monotonic() + 5
    while [pid for pid in everything if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in everything if alive(pid)]


@pytest.mark.slow
async def test_sigterm_closes_websockets_at_once_and_keeps_calls_until_the_drain_deadline(
    servers: list[Server],
) -> None:
    server, port = start(servers)
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
        realtime(port) as ws,
    ):
        caller = Caller(http)
        try:
            assert (await caller.connect()).status_code == 201
            await caller.wait_for(lambda e: e["type"] == "session.created")
            assert (await first_event(ws))["type"] == "session.created"
            sent = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            assert await close_code(ws) == 1012
            assert time.monotonic() - sent < 2
            seen = len(caller.events)
            await asyncio.sleep(DRAIN_S - 1)
            assert caller.pc.connectionState == "connected"
            assert len(caller.events) == seen  # no goodbye yet: the call goes on
            status = await asyncio.to_thread(server.proc.wait, 20)
            assert status == 0
            assert time.monotonic() - sent >= DRAIN_S
        finally:
            await caller.close()


def test_sip_is_served_by_one_worker_only(servers: list[Server]) -> None:
    sip_port = free_port()
    server, _ = start(servers, "--sip-port", str(sip_port))
    bound = subprocess.run(
        ["ss", "-Hlunp", f"sport = :{sip_port}"], capture_output=True, text=True, check=True
    ).stdout
    pids = {int(part.split(",")[0]) for part in bound.split("pid=")[1:]}
    assert len(pids) == 1 and pids <= set(workers_of(server)), bound


def test_workers_and_drain_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_settings(["serve"])[1].workers == 1
    assert parse_settings(["serve", "--workers", "auto"])[1].workers == (os.cpu_count() or 1)
    monkeypatch.setenv("PARLEY_WORKERS", "3")
    monkeypatch.setenv("PARLEY_DRAIN_S", "2.5")
    settings = parse_settings(["serve"])[1]
    assert (settings.workers, settings.drain_s, settings.worker_index) == (3, 2.5, None)
    for bad in (["--workers", "0"], ["--workers", "many"], ["--drain-s", "-1"]):
        with pytest.raises(SettingsError):
            parse_settings(["serve", *bad])


def serving_pid(port: int, client: ClientConnection) -> int:
    """The server process holding `client`'s TCP connection."""
    local_port = client.local_address[1]
    found = subprocess.run(
        ["ss", "-Htnp", f"( sport = :{port} and dport = :{local_port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(found.split("pid=")[1].split(",")[0])


async def test_a_drained_worker_hands_its_websocket_session_to_the_other(
    servers: list[Server],
) -> None:
    server, port = start(servers)
    async with realtime(port) as first:
        created = await first_event(first)
        session = created["session"]
        update = {"type": "session.update", "session": {"instructions": "Speak like a pirate."}}
        await first.send(json.dumps(update))
        while (await first_event(first))["type"] != "session.updated":
            pass
        drained = serving_pid(port, first)
        os.kill(drained, signal.SIGTERM)  # one worker only, as a rolling restart would
        assert await close_code(first) == 1012
    server.wait_for_line(f"pid {drained}", timeout=10)  # it ended, the parent starts another
    query = f"session_id={session['id']}&resume_token={session['parley']['resume_token']}"
    url = f"ws://127.0.0.1:{port}/v1/realtime?model=parley&{query}"
    async with connect(url, proxy=None) as second:
        assert serving_pid(port, second) != drained
        await second.send(json.dumps({"type": "session.update", "session": {}}))
        while (event := await first_event(second))["type"] != "session.updated":
            assert event["type"] != "error", event
        assert event["session"]["id"] == session["id"]
        assert event["session"]["instructions"] == "Speak like a pirate."


async def test_a_session_outlives_its_killed_worker(servers: list[Server]) -> None:
    server, port = start(servers)
    async with realtime(port) as first:
        session = (await first_event(first))["session"]
        update = {"type": "session.update", "session": {"instructions": "Speak like a pirate."}}
        await first.send(json.dumps(update))
        while (await first_event(first))["type"] != "session.updated":
            pass
        killed = serving_pid(port, first)
        os.kill(killed, signal.SIGKILL)
        await close_code(first)
    query = f"session_id={session['id']}&resume_token={session['parley']['resume_token']}"
    url = f"ws://127.0.0.1:{port}/v1/realtime?model=parley&{query}"
    async with connect(url, proxy=None) as second:
        await second.send(json.dumps({"type": "session.update", "session": {}}))
        while (event := await first_event(second))["type"] != "session.updated":
            assert event["type"] != "error", event
        assert event["session"]["id"] == session["id"]
        assert event["session"]["instructions"] == "Speak like a pirate."
    server.wait_for_line(f"pid {killed}", timeout=10)  # and the parent started another


def test_a_worker_that_cannot_start_stops_the_server_with_status_1(
    servers: list[Server], tmp_path: Path
) -> None:
    graph = tmp_path / "broken.yaml"
    graph.write_text(
        "name: broken\nstages:\n"
        "  - {name: model, engine: 'tests.fakes.fake_engine:FakeEngine',"
        " engine_args: {no_such_argument: 1}}\n"
        "outputs: [model]\n"
    )
    server, _ = launch(servers, pipeline=str(graph))
    assert server.proc.wait(60) == 1
    server.stop()
    output = "".join(server.output)
    assert "before the server was ready" in output and "no_such_argument" in output
    assert "Parley is ready" not in output
    assert (
        not [  # no worker left behind
            cmdline
            for cmdline in Path("/proc").glob("[0-9]*/cmdline")
            if str(graph).encode() in _read(cmdline)
        ]
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


HOSTED = (
    "name: hosted\nstages:\n"
    "  - {name: model, engine: 'tests.fakes.fake_engine:FakeEngine',"
    " engine_args: {audio_ms: 300}, placement: {process: worker}}\n"
    "outputs: [model]\n"
)


async def say_hi(ws: ClientConnection) -> None:
    """A typed "Hi", and an answer asked for."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    await ws.send(json.dumps({"type": "response.create"}))


async def answered(port: int) -> int:
    """Ask one question in a fresh session; the pid of the worker that answered it."""
    async with realtime(port) as ws:
        assert (await first_event(ws))["type"] == "session.created"
        pid = serving_pid(port, ws)
        await say_hi(ws)
        audio = 0
        while (event := await first_event(ws))["type"] != "response.done":
            assert event["type"] != "error", event
            audio += event["type"] in ("response.output_audio.delta", "response.audio.delta")
        assert event["response"]["status"] == "completed", event
        assert audio > 0
    return pid


async def test_a_worker_placed_stage_is_loaded_once_for_both_workers(
    servers: list[Server], tmp_path: Path
) -> None:
    graph = tmp_path / "hosted.yaml"
    graph.write_text(HOSTED)
    server, port = start(servers, pipeline=str(graph))
    under_parent = children(server.proc.pid)
    hosts = [pid for pid in under_parent if "pipeline.stage_host" in cmdline(pid)]
    assert len(hosts) == 1 and '"stage": "model"' in cmdline(hosts[0])
    for worker in workers_of(server):  # no stage worker of their own
        assert not [pid for pid in children(worker) if "pipeline.worker_main" in cmdline(pid)]
    served_by = {await answered(port) for _ in range(6)}
    for _ in range(20):  # the kernel's spread: both workers answer (1 in 2^26 they don't)
        if len(served_by) == 2:
            break
        served_by.add(await answered(port))
    assert served_by == set(workers_of(server))
    os.kill(hosts[0], signal.SIGKILL)  # the parent starts it again; the workers dial again
    server.wait_for_line("stage host model (pid", timeout=10)
    deadline = time.monotonic() + 30
    while True:
        try:
            await answered(port)
            break
        except AssertionError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
    now = [pid for pid in children(server.proc.pid) if "pipeline.stage_host" in cmdline(pid)]
    assert len(now) == 1 and now != hosts


async def test_a_stopped_stage_host_fails_the_turn_is_named_by_readyz_and_replaced(
    servers: list[Server], tmp_path: Path
) -> None:
    graph = tmp_path / "hosted.yaml"
    long_answer = "audio_ms: 20000, realtime_factor: 1.0}"
    hanging = HOSTED.replace("audio_ms: 300}", long_answer).replace(
        "placement: {process: worker}}", "placement: {process: worker}, hang_s: 2}"
    )
    graph.write_text(hanging)
    server, port = start(servers, pipeline=str(graph))
    (host,) = [p for p in children(server.proc.pid) if "pipeline.stage_host" in cmdline(p)]
    async with realtime(port) as ws:
        assert (await first_event(ws))["type"] == "session.created"
        await say_hi(ws)
        while (await first_event(ws))["type"] not in ("response.output_audio.delta",):
            pass
        os.kill(host, signal.SIGSTOP)
        stopped = time.monotonic()
        while (done := await first_event(ws))["type"] != "response.done":
            pass
        failed_after = time.monotonic() - stopped
    assert done["response"]["status"] == "failed", done
    details = json.dumps(done["response"]["status_details"])
    assert "model" in details and "hung: no word from it for 2 s" in details, details
    assert failed_after < 2 + 4  # not the 30 s chunk deadline
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        down = await http.get("/readyz")  # before the new host is up and dialled
        assert down.status_code == 503, down.text
        assert "model" in down.json()["down_stages"], down.text
        assert any(r.startswith("stage model: hung") for r in down.json()["reasons"])
        server.wait_for_line("sent no heartbeat for 3 s: hung; killing it", timeout=10)
        deadline = time.monotonic() + 30
        while (await http.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        replaced_after = time.monotonic() - stopped
    assert not alive(host)
    (new,) = [p for p in children(server.proc.pid) if "pipeline.stage_host" in cmdline(p)]
    assert new != host
    await answered(port)
    print(
        f"--workers 2, SIGSTOP on the stage host: the turn failed after {failed_after:.2f} s, "
        f"/readyz 200 again after {replaced_after:.2f} s"
    )


def test_with_stage_hosts_off_each_worker_loads_its_own(
    servers: list[Server], tmp_path: Path
) -> None:
    graph = tmp_path / "hosted.yaml"
    graph.write_text(HOSTED)
    server, _ = start(servers, "--stage-hosts", "off", pipeline=str(graph))
    assert not [p for p in children(server.proc.pid) if "pipeline.stage_host" in cmdline(p)]
    for worker in workers_of(server):
        assert len([p for p in children(worker) if "pipeline.worker_main" in cmdline(p)]) == 1
    with pytest.raises(SettingsError, match="--stage-hosts: on or off"):
        parse_settings(["serve", "--stage-hosts", "maybe"])


def test_a_stop_while_the_stages_load_is_prompt(servers: list[Server], tmp_path: Path) -> None:
    """Ctrl-C while a worker-placed stage still loads (a model converting on its first use
    takes tens of seconds): everything stops within seconds, not once the model is loaded,
    and exits 0 with no process left."""
    graph = tmp_path / "loading.yaml"
    graph.write_text(HOSTED.replace("audio_ms: 300", "start_delay_s: 120"))
    server, _ = launch(servers, pipeline=str(graph))
    server.wait_for_line("worker 1 started", timeout=30)
    time.sleep(2.0)  # the workers wait for the host, which is loading
    everything = children(server.proc.pid)
    assert len(everything) == 4  # redis-server, the stage host, two workers
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(15) == 0
    assert not [pid for pid in everything if alive(pid)]
    assert "Parley is ready" not in "".join(server.output)


@pytest.mark.slow
async def test_under_mps_a_stage_host_that_dies_restarts_every_host_under_a_fresh_daemon(
    servers: list[Server], tmp_path: Path
) -> None:
    """The MPS daemon is the stand-in (`tests/fakes/mps_control.py`): what Parley does when
    one client of it dies is what is checked, not what the real daemon does to the rest."""
    from tests.fakes import mps_control

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mps_control.install(bin_dir)
    graph = tmp_path / "shared_gpu.yaml"
    graph.write_text(
        HOSTED.replace("name: hosted\n", "name: shared_gpu\ngpu_sharing: mps\n").replace(
            "outputs: [model]\n",
            "  - {name: relay, engine: 'tests.fakes.stage_engines:Relay',"
            " placement: {process: worker}}\n"
            "edges:\n  - {from: model, to: relay}\noutputs: [relay]\n",
        )
    )
    port = free_port()
    root = str(Path(__file__).parents[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    env |= {"PYTHONPATH": root, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    server = Server(
        "--port", str(port), "--pipeline", str(graph), "--workers", "2", env=env
    )  # fmt: skip
    servers.append(server)
    server.wait_for_line("Parley is ready", timeout=60)
    hosts = [p for p in children(server.proc.pid) if "pipeline.stage_host" in cmdline(p)]
    daemons = mps_daemons_of(server.proc.pid)
    assert len(hosts) == 2 and len(daemons) == 1
    await answered(port)
    os.kill(hosts[0], signal.SIGKILL)
    server.wait_for_line("restarting every stage host (2) with a fresh MPS daemon", timeout=10)
    deadline = time.monotonic() + 30
    while True:
        try:
            await answered(port)
            break
        except AssertionError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
    now = [p for p in children(server.proc.pid) if "pipeline.stage_host" in cmdline(p)]
    assert len(now) == 2 and not set(now) & set(hosts)
    assert not alive(daemons[0])
    fresh = mps_daemons_of(server.proc.pid)
    assert len(fresh) == 1 and alive(fresh[0])
    server.proc.send_signal(signal.SIGTERM)  # a stop quits the daemon: nothing left behind
    assert server.proc.wait(20) == 0
    deadline = time.monotonic() + 5
    while alive(fresh[0]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive(fresh[0])


def mps_daemons_of(owner: int) -> list[int]:
    """The MPS daemons (the stand-in's) the process `owner` started, by their records."""
    found = []
    for record in Path(tempfile.gettempdir()).glob("parley-mps-*/owner.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(record.read_text())["pid"] == owner:
                found.append(
                    int((record.parent / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
                )
    return found
