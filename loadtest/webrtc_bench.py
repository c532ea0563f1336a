"""Benchmark: WebRTC barge-in latency and how many calls one server holds.

Starts `parley serve --pipeline echo` (the loopback pipeline: answers are the caller's own
words, so no model time is measured) with its embedded Redis, then calls it with real aiortc
peers over loopback (Opus both ways).

- barge-in: a question, its answer starts, 1 s later the caller says "Hold on, stop.".
  Latency = first frame of the interruption sent -> last frame of the interrupted answer
  received (a frame with RMS > 300 before the next `response.created`).
- capacity: for each step N, N calls loop "question, wait for the answer" for a window; the
  server's `parley_webrtc_late_frames_total / parley_webrtc_outbound_frames_total` over the
  window must stay under 1 %, and every call must get answers. CPU is the server's
  (its processes' /proc stat, Redis left out), per call; and per outbound frame (each call
  sends and receives 50 frames a second), in all and on the event loop's thread alone: the
  loop runs every call's per-frame work, so its share is what decides late frames. The
  callers' CPU (this process, all its threads) is printed too: on a shared box it is the
  server's competition.
- `--profile`: py-spy (if on PATH; `pip install py-spy`) samples the server's loop thread
  while it holds the GIL during each step's window; the step prints where the loop's time
  goes (by the callback the loop ran, and by function), and the raw samples stay in
  /tmp/webrtc_bench_<calls>.txt.

    .venv/bin/python -m loadtest.webrtc_bench [--barge 30] [--steps 1,10,20,30] [--window 20]
                                              [--workers N|auto] [--nice 10] [--json PATH]

`--json PATH` keeps the figures as a report (what `loadtest.plots` draws from, once it is in
`loadtest/results/`): the commit and start time, the machine's cores and load average
before the run, the arguments, every barge-in latency and every step's row as printed.

`--workers`: the server runs that many processes behind its port; CPU and late frames are
then summed over the workers (their /metrics samples carry a `process` label).

The callers run on the same 2 cores as the server, so capacity is a lower bound; with
`--nice 10` they yield the CPU to the server (a single loop thread against the callers'
dozens of aiortc threads otherwise gets a thin share of a saturated machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from pipeline.tasks import TaskSet

from .proc_cpu import cpu_seconds, is_redis, tree
from .run_stamp import source_stamp
from .served import metric_total, parley_serve
from .speech import silence, speak, trim_silence
from .webrtc_client import Caller

QUESTION = "What is the weather going to be like tomorrow in Boston?"
STOP = "Hold on, stop."


def server_pids(pid: int) -> list[int]:
    """`pid` and every process under it but Redis: with `--workers` the parent only
    supervises, and the calls are served by its children."""
    return [p for p in tree(pid) if not is_redis(p)]


def server_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the server's processes, in all and on their main threads."""
    pids = server_pids(pid)
    return sum(cpu_seconds(p) for p in pids), sum(cpu_seconds(p, p) for p in pids)


def start_profile(pid: int, n: int, seconds: float) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy")
    if spy is None:
        print("  --profile: py-spy is not on PATH (pip install py-spy)", file=sys.stderr)
        return None
    out = f"/tmp/webrtc_bench_{n}.txt"
    command = [spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100"]
    command += ["--gil", "--nonblocking", "-f", "raw", "-o", out]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def print_profile(n: int, top: int = 12) -> None:
    """The loop thread's samples: by the callback the loop ran (a task's coroutine or a
    plain callback), and by the function on top of the stack."""
    callbacks: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for line in Path(f"/tmp/webrtc_bench_{n}.txt").read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames[0].startswith("<module>"):
            continue  # another thread
        runs = [
            i
            for i, f in enumerate(frames)
            if f.startswith(("Handle._run", "BaseEventLoop._run_once"))
        ]
        start = runs[-1] + 1 if runs else 0
        callbacks[frames[min(start, len(frames) - 1)].split(" (")[0]] += int(count)
        functions[frames[-1]] += int(count)
    total = sum(callbacks.values()) or 1
    for title, counter in (("loop callbacks", callbacks), ("functions", functions)):
        print(f"  loop thread by {title} ({total} samples):")
        for name, samples in counter.most_common(top):
            print(f"    {100 * samples / total:5.1f} % {name}")


async def late_frames(http: httpx.AsyncClient) -> tuple[float, float]:
    text = (await http.get("/metrics")).text
    return (
        metric_total(text, "parley_webrtc_late_frames_total"),
        metric_total(text, "parley_webrtc_outbound_frames_total"),
    )


def utterance(text: str) -> np.ndarray:
    return trim_silence(speak(text))


BARGE_TRY_S = 7.0
"""About how long one interruption takes, question to the next answer's end (echo)."""


async def barge_in(http: httpx.AsyncClient, tries: int) -> list[float]:
    caller = Caller(http)
    latencies: list[float] = []
    try:
        if (await caller.connect()).status_code != 201:
            raise RuntimeError("call refused")
        await caller.wait_for(lambda e: e["type"] == "session.created")
        question, stop = utterance(QUESTION), utterance(STOP)
        for _ in range(tries):
            answers = caller.count("response.created")
            caller.mic.say(np.concatenate([question, silence(100)]))
            await caller.wait_count("response.created", answers + 1, within_s=30)
            await caller.wait_count(
                "output_audio_buffer.started", caller.count("output_audio_buffer.stopped") + 1
            )
            await asyncio.sleep(1.0)
            caller.mic.say(stop)
            await asyncio.sleep(0.1)
            sent = caller.mic.speech_started_at[-1]
            await caller.wait_count(
                "conversation.item.truncated", caller.count("conversation.item.truncated") + 1, 10
            )
            # The interruption is a turn of its own: once its answer starts, every frame of
            # the old answer is in; then let that answer play out.
            await caller.wait_count("response.created", answers + 2, within_s=10)
            next_reply = time.monotonic()
            old = [t for t in caller.loud_since(sent) if t < next_reply]
            latencies.append(((old[-1] - sent) if old else 0.0) * 1000)
            await caller.wait_count(
                "output_audio_buffer.stopped", caller.count("output_audio_buffer.started"), 15
            )
            await asyncio.sleep(0.3)
    except TimeoutError:
        print("timed out; events:", caller.types()[-25:], file=sys.stderr)
        raise
    finally:
        await caller.close()
    return latencies


async def sessions_gone(http: httpx.AsyncClient, within_s: float = 30.0) -> None:
    """Wait until the server holds no session: a step's calls must not count against the
    next step's session limit while they end."""
    deadline = time.monotonic() + within_s
    while metric_total((await http.get("/metrics")).text, "parley_active_sessions") > 0:
        if time.monotonic() > deadline:
            return  # the next step will show it: refused calls are counted and named
        await asyncio.sleep(0.2)


async def loop_calls(
    http: httpx.AsyncClient,
    n: int,
    warm_s: float,
    window_s: float,
    pid: int,
    profile: bool,
    barging: int = 0,
) -> dict[str, Any]:
    """`n` calls asking and hearing answers in a loop; `barging` more calls, from the
    window's start, each interrupting answers (`barge_in`) for as long as the window lasts:
    barge-in under that load."""
    question = utterance(QUESTION)
    callers = [Caller(http) for _ in range(n)]
    answers = [0] * n
    stop = asyncio.Event()

    async def talk(i: int, caller: Caller) -> None:
        await asyncio.sleep(i * min(0.3, 9.0 / max(1, n)))  # stagger the starts
        if (await caller.connect()).status_code != 201:
            raise RuntimeError(f"call {i} refused")
        while not stop.is_set():
            done = caller.count("output_audio_buffer.stopped")
            caller.mic.say(np.concatenate([question, silence(100)]))
            await caller.wait_count("output_audio_buffer.stopped", done + 1, within_s=30)
            answers[i] += 1
            await asyncio.sleep(0.3)

    talkers = TaskSet("webrtc-bench")  # their failures are counted below
    tasks = [talkers.create_task(talk(i, c), log_failure=False) for i, c in enumerate(callers)]
    try:
        await asyncio.sleep(warm_s + min(9.0, 0.3 * n))
        late0, frames0 = await late_frames(http)
        (cpu0, loop0), t0 = server_cpu(pid), time.monotonic()
        callers0 = cpu_seconds(os.getpid())
        answered0 = sum(answers)
        spy = start_profile(pid, n, window_s) if profile else None
        tries = max(1, int(window_s // BARGE_TRY_S))
        barges = [talkers.create_task(barge_in(http, tries)) for _ in range(barging)]
        await asyncio.sleep(window_s)
        if spy is not None:
            await asyncio.to_thread(spy.wait)
            print_profile(n)
        late1, frames1 = await late_frames(http)
        elapsed = time.monotonic() - t0
        cpu1, loop1 = server_cpu(pid)
        callers_cpu = (cpu_seconds(os.getpid()) - callers0) / elapsed
        cpu_s, loop_s = cpu1 - cpu0, loop1 - loop0
        cpu = cpu_s / elapsed
        answered = sum(answers) - answered0
        failed = [t for t in tasks if t.done() and t.exception() is not None]
        barged: list[float] = []
        if barges:
            done, _ = await asyncio.wait(barges, timeout=BARGE_TRY_S * (tries + 2))
            for task in done:
                if task.exception() is None:
                    barged.extend(task.result())
    finally:
        stop.set()
        await talkers.close()
        await asyncio.gather(*(c.close() for c in callers))
    frames = frames1 - frames0
    return {
        "calls": n,
        "late_pct": 100 * (late1 - late0) / frames if frames else 100.0,
        "answers_in_window": answered,
        "failed_calls": len(failed),
        "failures": sorted({str(t.exception())[:120] for t in failed})[:3],
        "server_cpu_pct": 100 * cpu,
        "cpu_pct_per_call": 100 * cpu / n,
        "loop_cpu_pct": 100 * loop_s / elapsed,
        "cpu_us_per_frame": 1e6 * cpu_s / frames if frames else 0.0,
        "loop_us_per_frame": 1e6 * loop_s / frames if frames else 0.0,
        "callers_cpu_pct": 100 * callers_cpu,
        "barge_in_ms": barged,
    }


def latency_figures(latencies: list[float]) -> dict[str, Any]:
    """p50, p95 and max of the barge-in latencies (ms), with every value kept."""
    if not latencies:
        return {"n": 0, "ms": []}
    return {
        "n": len(latencies),
        "p50_ms": round(float(np.percentile(latencies, 50)), 1),
        "p95_ms": round(float(np.percentile(latencies, 95)), 1),
        "max_ms": round(max(latencies), 1),
        "ms": [round(x, 1) for x in latencies],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Barge-in, then the steps, printed as they end; returns them for `--json`."""
    steps = [int(s) for s in args.steps.split(",") if s]
    report: dict[str, Any] = {
        "header": {
            **source_stamp(),
            "machine": {"cores": os.cpu_count(), "load_average_before": os.getloadavg()},
            "argv": vars(args) | {"json": str(args.json) if args.json else None},
        },
        "barge_in": latency_figures([]),
        "steps": [],
    }
    with parley_serve(
        "--pipeline",
        "echo",
        "--max-sessions",
        str(max(steps + [4]) + args.barge_under_load + 2),
        "--workers",
        args.workers,
        start_s=60,
    ) as served:
        pid = served.process.pid
        if args.nice:
            # After the server started (it would inherit it), before any caller exists:
            # on Linux a niceness is a thread's, and threads inherit their creator's.
            os.nice(args.nice)
        # No keep-alive: each call's offer on a connection of its own, as from its own
        # browser, so that with --workers the kernel spreads the calls over the processes
        # (one kept-alive connection would bring every call to the same worker).
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=served.http_url, timeout=30, limits=fresh) as http:
            if args.barge:
                latencies = await barge_in(http, args.barge)
                report["barge_in"] = latency_figures(latencies)
                p50, p95 = np.percentile(latencies, 50), np.percentile(latencies, 95)
                print(
                    f"barge-in ({len(latencies)} interruptions): p50 {p50:.0f} ms, "
                    f"p95 {p95:.0f} ms (max {max(latencies):.0f} ms)",
                    flush=True,
                )
            for n in steps:
                await sessions_gone(http)
                row = await loop_calls(
                    http, n, args.warm, args.window, pid, args.profile, args.barge_under_load
                )
                ok = (
                    row["late_pct"] < 1.0
                    and not row["failed_calls"]
                    and row["answers_in_window"] >= n
                )
                kept = {k: v for k, v in row.items() if k != "barge_in_ms"}
                report["steps"].append(
                    kept | {"ok": ok, "barge_in": latency_figures(row["barge_in_ms"])}
                )
                print(
                    f"{n:3d} calls: late {row['late_pct']:5.2f} %, "
                    f"failed {row['failed_calls']}, answers {row['answers_in_window']:.0f}, "
                    f"server CPU {row['server_cpu_pct']:5.1f} % "
                    f"({row['cpu_pct_per_call']:.1f} %/call; loop thread "
                    f"{row['loop_cpu_pct']:.1f} %), per outbound frame "
                    f"{row['cpu_us_per_frame']:.0f} us CPU, {row['loop_us_per_frame']:.0f} us "
                    f"on the loop; callers' CPU {row['callers_cpu_pct']:5.1f} % "
                    f"({row['callers_cpu_pct'] / n:.1f} %/call) -> {'ok' if ok else 'FAIL'}",
                    flush=True,
                )
                if row["failures"]:
                    print(f"     failures: {'; '.join(row['failures'])}", flush=True)
                if barged := row["barge_in_ms"]:
                    print(
                        f"     barge-in beside them ({len(barged)} interruptions): p50 "
                        f"{np.percentile(barged, 50):.0f} ms, p95 {np.percentile(barged, 95):.0f} "
                        f"ms (max {max(barged):.0f} ms)",
                        flush=True,
                    )
                if not ok:
                    break
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description="WebRTC barge-in latency and capacity")
    parser.add_argument("--barge", type=int, default=30, help="interruptions (0 skips)")
    parser.add_argument("--steps", default="1,10,20,30", help="concurrent calls per step")
    parser.add_argument("--warm", type=float, default=4.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--profile", action="store_true", help="py-spy the loop per step")
    parser.add_argument(
        "--barge-under-load",
        type=int,
        default=0,
        help="at each step, this many more calls interrupt answers through the window "
        "(barge-in measured beside the step's calls)",
    )
    parser.add_argument("--workers", default="1", help="parley serve --workers (N or auto)")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the callers at this niceness (the server keeps its own): the server "
        "gets the CPU first, as on a host of its own",
    )
    parser.add_argument(
        "--json", type=Path, help="also write the figures here, e.g. loadtest/results/NAME.json"
    )
    args = parser.parse_args()
    report = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report: {args.json}")


if __name__ == "__main__":
    main()
