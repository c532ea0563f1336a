"""Issue 40's fault target, measured against a real `parley serve`: a fault injected into each
GPU stage (a device-side assert, a killed worker) and into Moshi's clock is detected within
5 s, `/readyz` is red until recovered, the sessions hit are told, the service is back within
60 s.

The drill starts `python -m web.cli serve --pipeline P` in a child process with
`PARLEY_INJECT_DEVICE_FAULT` set (pipeline/device_faults.py), waits for `/readyz` 200 and
keeps the server's log beside `--out` (its start-up lines about capacity, memory, rows and
the session cap go into the report). Then, for each fault in turn, a client opens a session
as a real one would (OpenAI Realtime `/v1/realtime` for a turn-based graph: a text turn;
GPT-Live `/v1/live/sessions` for a duplex one: a microphone streaming), and at its first
output delta the fault goes in: a file naming the model thread (`thinker`, `talker`,
`code2wav`, `clock`; `--real` makes it a real device-side assert where CUDA runs) or a
SIGKILL of a stage's worker process (`kill:<stage>`). Measured from that moment: the client
told (`error` or a failed `response.done`, with its code), `/readyz` non-200 (polled every
50 ms), `/readyz` 200 again, the first delta of a NEW session's response, and whether the
hit session (if it is still open) is served again. Every wait is bounded (`--wait-s`). A
server that exits (a stage in its own process, Moshi's clock after a sticky error, exits
for its supervisor) is started again here as a supervisor would, and the restart counted
in the time to come back.

    python -m loadtest.fault_drill --pipeline qwen3_omni_tiny --faults thinker,talker,kill:talker \
        --out drill.json                                                   # CPU, tiny graphs
    python -m loadtest.fault_drill --pipeline moshi_tiny --faults clock --out drill-moshi.json
    python -m loadtest.fault_drill --pipeline qwen3_omni --real --wait-s 300 \
        --faults thinker,talker,code2wav,kill:thinker,kill:talker,kill:code2wav --out omni.json
    python -m loadtest.fault_drill --pipeline moshi --real --wait-s 300 --faults clock \
        --out moshi.json     # GPU: a long wait, so that a restart past 60 s is measured
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from pipeline.tasks import TaskSet

from .run_stamp import command_output, source_stamp
from .supervised_serve import POLL_S, Server, readyz

TOLD_S, BACK_S = 5.0, 60.0
"""The targets: the client told within 5 s of the fault, the service back within 60 s."""
THREADS = {stage: f"parley-qwen3_omni.{stage}" for stage in ("thinker", "talker", "code2wav")}
THREADS["clock"] = "parley-moshi-clock"
"""A fault's name -> the model thread it is injected into (ModelThread's name in
qwen3_omni/stage.py, the clock's hook in moshi/duplex_engine.py)."""
DELTAS = {f"response.output_{kind}.delta" for kind in ("audio", "text", "audio_transcript")}
DELTAS |= {"session.output_audio.delta", "session.output_transcript.delta"}


def since(t0: float, at: float | None) -> float | None:
    return None if at is None else round(at - t0, 3)


class Session:
    """One client session: Realtime text turns, or a GPT-Live microphone streaming (a
    duplex model speaks when it likes). `read` notes what the client was told."""

    def __init__(self, ws: ClientConnection, duplex: bool) -> None:
        self.ws, self.duplex = ws, duplex
        self.told: tuple[str, float] | None = None
        """The code of the first failure the client was told of, and when."""
        self.closed: int | None = None
        self.answering = False
        """A response asked for has not ended yet (`response.done`)."""

    async def ask(self) -> None:
        if self.duplex:
            return  # the microphone streams all along; the model answers when it likes
        text = {"type": "input_text", "text": "Tell me about the sea."}
        item = {"type": "message", "role": "user", "content": [text]}
        await self.ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await self.ws.send(json.dumps({"type": "response.create"}))
        self.answering = True

    async def read(self, deadline: float) -> dict[str, Any] | None:
        """The next event; None once the session closed or at `deadline`."""
        if self.closed is not None:
            return None
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                event: dict[str, Any] = json.loads(await self.ws.recv())
        except TimeoutError:
            return None
        except ConnectionClosed as closed:
            self.closed = closed.rcvd.code if closed.rcvd else 1006
            return None
        self.answering &= event["type"] != "response.done"
        code = failure_code(event)
        if code is not None and self.told is None:
            self.told = (code, time.monotonic())
        return event

    async def first_delta(self, deadline: float) -> float | None:
        """When the answer's first output delta came; None if it ended without one."""
        while (event := await self.read(deadline)) is not None:
            if event["type"] in DELTAS:
                return time.monotonic()
            if event["type"] == "response.done" or failure_code(event) is not None:
                return None
        return None

    async def microphone(self) -> None:
        """100 ms of a quiet 220 Hz tone every 100 ms, in real time (24 kHz PCM16)."""
        tone = np.sin(2 * np.pi * 220 * np.arange(2400) / 24_000) * 3000
        audio = base64.b64encode(tone.astype("<i2").tobytes()).decode()
        text = json.dumps({"type": "session.input_audio.append", "audio": audio})
        due = time.monotonic()
        with contextlib.suppress(ConnectionClosed):
            while True:
                await self.ws.send(text)
                due += 0.1
                await asyncio.sleep(max(0.0, due - time.monotonic()))


def failure_code(event: dict[str, Any]) -> str | None:
    """The code of a failure the client is told of in `event`, or None."""
    if event.get("type") == "error":
        return str((event.get("error") or {}).get("code") or "error")
    response = event.get("response") or {}
    if event.get("type") == "response.done" and response.get("status") == "failed":
        details = response.get("status_details") or {}
        return str((details.get("error") or {}).get("code") or "failed")
    return None


@contextlib.asynccontextmanager
async def session(port: int, duplex: bool, deadline: float) -> AsyncIterator[Session]:
    """A session opened as a client would (`session.created` / `session.started` seen)."""
    path = "/v1/live/sessions" if duplex else "/v1/realtime?model=parley"
    wait_s = max(1.0, deadline - time.monotonic())
    url = f"ws://127.0.0.1:{port}{path}"
    async with connect(url, proxy=None, max_size=None, open_timeout=wait_s) as ws:
        client = Session(ws, duplex)
        if duplex:
            start = {"model": "gpt-live-1", "instructions": "Chat."}
            await ws.send(json.dumps({"type": "session.start", "session": start}))
        opened = "session.started" if duplex else "session.created"
        while (event := await client.read(deadline)) is None or event["type"] != opened:
            if event is None or client.told is not None:
                raise RuntimeError(f"no {opened}: {client.told or client.closed or 'timed out'}")
        async with TaskSet("fault-drill-microphone") as tasks:  # the body's errors as they are
            if duplex:
                tasks.create_task(client.microphone(), name="microphone")
            yield client


async def watch_ready(port: int, t0: float, deadline: float, out: dict[str, Any]) -> None:
    """`/readyz` every 50 ms from `t0`: when it first went non-200 (its body then), and
    when it was 200 again after that."""
    while time.monotonic() < deadline:
        status, body = await readyz(port)
        now = time.monotonic()
        if status != 200 and out["red_s"] is None:
            out["red_s"], out["red_body"] = since(t0, now), body[:500] or f"status {status}"
        elif status == 200 and out["red_s"] is not None:
            out["back_s"] = since(t0, now)
            return
        await asyncio.sleep(max(0.0, POLL_S - (time.monotonic() - now)))


def inject(server: Server, fault: str, fault_file: Path, real: bool) -> str:
    """Put `fault` in: a SIGKILL of a stage's process (`kill:<stage>`) or the fault file
    naming a model thread. What was done, in words."""
    if fault.startswith("kill:"):
        stage = fault.removeprefix("kill:")
        pid = server.stage_pid(stage)
        if pid is None:
            raise RuntimeError(f"no worker or stage-host process serves stage {stage!r}")
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL to pid {pid}"
    text = f"real {THREADS.get(fault, fault)}" if real else THREADS.get(fault, fault)
    fault_file.write_text(text)
    return f"{fault_file.name} says {text!r}"


async def drill(server: Server, fault: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"fault": fault, "told": None, "told_s": None, "red_s": None}
    out |= {"red_body": None, "back_s": None, "new_session_delta_s": None, "error": None}
    duplex, fault_file = "moshi" in args.pipeline, args.fault_file
    fault_file.unlink(missing_ok=True)  # left by a drill that failed
    if await server.ready(args.wait_s) is None:
        out["error"] = f"/readyz not 200 within {args.wait_s:g} s before the fault"
        return out
    t0 = time.monotonic()
    async with session(server.port, duplex, t0 + args.wait_s) as hit:
        await hit.ask()
        if await hit.first_delta(t0 + args.wait_s) is None:
            out["error"] = f"no output before the fault ({hit.told or hit.closed})"
            return out
        t0 = time.monotonic()
        deadline = t0 + args.wait_s
        out["injected"] = inject(server, fault, fault_file, args.real)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(watch_ready(server.port, t0, deadline, out))
            while hit.told is None and (event := await hit.read(deadline)) is not None:
                if event["type"] == "response.done" and fault_file.exists():
                    await hit.ask()  # the answer ended before the fault fired: ask again
        out["fired"] = not fault_file.exists()
        fault_file.unlink(missing_ok=True)  # a fault that never fired hits no later drill
        if hit.told is not None:
            out["told"], out["told_s"] = hit.told[0], since(t0, hit.told[1])
        out["hit_session_closed"] = hit.closed
        while hit.answering and await hit.read(deadline) is not None:
            pass  # the failed answer's end
        if out["back_s"] is not None and hit.closed is None and not duplex:
            await hit.ask()  # the session hit is served again
            served = await hit.first_delta(deadline)
            out["hit_session_served_s"] = since(t0, served)
    while out["back_s"] is not None and time.monotonic() < deadline:  # a new session
        try:
            async with session(server.port, duplex, deadline) as fresh:
                await fresh.ask()
                if (at := await fresh.first_delta(deadline)) is not None:
                    out["new_session_delta_s"] = since(t0, at)
                    break
                out["new_session_error"] = str(fresh.told or fresh.closed)
        except (OSError, RuntimeError, ConnectionClosed, TimeoutError) as exc:
            out["new_session_error"] = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(0.5)
    if server.exits:
        await server.ready(1.0)  # notes the restart's start-up
    out["server_exits"] = [
        {"status": e["status"], "at_s": since(t0, e["at"])} for e in server.exits if e["at"] > t0
    ]
    told_s, back_s = out["told_s"], out["back_s"]
    out["verdict"] = {
        f"told_within_{TOLD_S:g}s": told_s is not None and told_s <= TOLD_S,
        "red_seen": out["red_s"] is not None,
        f"back_within_{BACK_S:g}s": back_s is not None and back_s <= BACK_S,
        "new_session_served": out["new_session_delta_s"] is not None,
    }
    return out


def line(r: dict[str, Any]) -> str:
    if "verdict" not in r:
        return f"{r['fault']}: not run: {r['error']}"
    s = {k: "timeout" if r[k] is None else f"{r[k]:.2f} s" for k in ("told_s", "red_s", "back_s")}
    first = r["new_session_delta_s"]
    verdict = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in r["verdict"].items())
    return (
        f"{r['fault']}: told {r['told'] or 'nothing'} at {s['told_s']}, /readyz red at "
        f"{s['red_s']}, back at {s['back_s']}, a new session's first delta at "
        f"{'timeout' if first is None else f'{first:.2f} s'} (from the fault): {verdict}: "
        f"{'MET' if all(r['verdict'].values()) else 'MISSED'}"
    )


def machine() -> dict[str, Any]:
    gpu = None
    if shutil.which("nvidia-smi"):
        gpu = command_output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "gpu": gpu}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    report |= {"source": source_stamp(), "pipeline": args.pipeline, "machine": machine()}
    report |= {"real_faults": args.real, "wait_s": args.wait_s, "faults": []}
    env = {"PARLEY_INJECT_DEVICE_FAULT": str(args.fault_file)}
    server = Server(args.pipeline, shlex.split(args.server_args), env, args.log)
    report["server"] = {"command": server.cmd, "log": str(args.log)}
    server.start()
    try:
        started = await server.ready(args.ready_timeout_s)
        report["server"]["start_s"] = started and round(started, 2)
        if started is None:
            report["error"] = f"/readyz not 200 within {args.ready_timeout_s:g} s"
            print(f"server not ready: {report['error']} (log: {args.log})")
            return report
        print(f"server ready in {started:.1f} s; capacity lines:")
        for found in server.starts[0]["capacity_lines"]:
            print(f"  {found}")
        async with TaskSet("fault-drill-supervisor") as tasks:  # cancelled at its end
            tasks.create_task(server.supervise(), name="supervisor")
            for fault in args.faults.split(","):
                try:
                    result = await drill(server, fault.strip(), args)
                except Exception as exc:  # one fault's failure, recorded; the next goes on
                    result = {"fault": fault, "error": f"{type(exc).__name__}: {exc}"}
                report["faults"].append(result)
                print(line(result), flush=True)
    finally:
        server.stop()
        report["server"]["starts"] = server.starts
    return report


def main(argv: list[str] | None = None) -> int:
    """0 when every fault met its targets."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--pipeline", default="qwen3_omni_tiny")
    p.add_argument("--faults", default="thinker,talker,kill:talker", help="comma-separated")
    p.add_argument("--real", action="store_true", help="a real device-side assert (CUDA)")
    p.add_argument("--out", default="fault_drill.json")
    p.add_argument("--ready-timeout-s", type=float, default=600.0)
    p.add_argument("--wait-s", type=float, default=90.0, help="the bound of every wait")
    p.add_argument("--server-args", default="", help="more `serve` options, one string")
    args = p.parse_args(argv)
    args.log = Path(args.out).with_suffix(".log")
    args.log.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="parley-drill-") as tmp:
        args.fault_file = Path(tmp) / "fault"
        report = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"report: {args.out}, server log: {args.log}")
    verdicts = [r.get("verdict") or {"ran": False} for r in report["faults"]]
    return 0 if verdicts and all(all(v.values()) for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
