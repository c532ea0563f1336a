"""A duplex model's latency as its clients hear it, and the sessions it holds on its clock.

`moshi_steps` times the frame's work alone; this runs the engine itself (its 80 ms clock,
the codec, the streams) with N sessions whose microphones send a frame every 80 ms in real
time, and measures, for each microphone frame, the time from its last sample reaching the
engine to the delivery of the first voice frame the model made after hearing it. That is
what the session layer adds to the model's own delay: a frame waits for the next tick, the
step runs, the voice frame is decoded and handed over. A client hears, on top: the frame it
had to fill first (80 ms: Mimi's frame) and Moshi's one-frame acoustic delay (80 ms), the
160 ms of its paper's theoretical latency, plus its network.

A level's figures leave out its first two seconds, where every session joins at once (an
artefact of the bench: sessions of a service join one by one); the whole level's latency is
in the report beside them. A level holds real time when, after those two seconds, under 1 %
of its ticks took longer than the frame and its latency p95 stays inside two frames. Each
level reports where a tick's time went (joins and leaves, encode, step, decode).

It runs the engine of a graph file, `--pipeline` (pipeline/configs/moshi.yaml by default),
built from its stage's arguments and started as the server starts it (rows sized to the card
where the file says `auto`); a level of more sessions than the graph holds is not run, and
the report says so. What the command changes (`--set moshi.KEY=VALUE`, `--device`,
`--model-path`) is an override, printed with the figures (bench_graph.py).

    python -m loadtest.duplex_latency --sessions 1,8,16,32 --seconds 10      # on the GPU
    python -m loadtest.duplex_latency --pipeline moshi_tiny --sessions 1,4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from .bench_graph import add_graph_options, graph_from_args, header_lines
from .run_stamp import source_stamp

FRAME_S = 0.08
MODEL_DELAY_MS = 160.0
"""Mimi's frame and Moshi's acoustic delay: the model's own part of what a client hears."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


SETTLE_S = 2.0
"""The start of a level left out of its steady figures: every session joins at once there
(each a new batch size, then a standing queue the inbox cuts back within ~1 s)."""


def phases(ticks: list[Any]) -> dict[str, dict[str, float]]:
    """p50 / p95 of each part of `ticks` (the engine's StepTimes)."""
    if not ticks:
        return {}
    names = ("rows", "encode", "step", "decode", "total")
    return {
        name: {
            "p50": statistics.median(getattr(t, name) for t in ticks),
            "p95": percentile([getattr(t, name) for t in ticks], 0.95),
        }
        for name in names
    }


async def level(
    engine: Any, sessions: int, seconds: float, settle_s: float = SETTLE_S
) -> dict[str, Any]:
    from pipeline.engines.moshi.mimi_frames import FRAME_SAMPLES

    rng = np.random.default_rng(sessions)
    latencies: list[tuple[float, float]] = []
    """(when the frame was fed, its latency in ms)."""
    stats = engine.stats
    steps_before, late_before, skipped_before = stats.steps, stats.late_steps, stats.skipped_in
    began = time.monotonic()
    settled = began + settle_s

    async def one(k: int) -> None:
        stream = engine.open(f"s{k}")
        fed_at: list[float] = []
        mic = (rng.standard_normal(FRAME_SAMPLES) * 2000).astype(np.int16)

        async def speak() -> None:
            await asyncio.sleep(FRAME_S * k / max(1, sessions))  # microphones out of phase
            due = time.monotonic()
            while True:
                stream.feed(mic)
                fed_at.append(time.monotonic())
                due += FRAME_S
                await asyncio.sleep(max(0.0, due - time.monotonic()))

        async def listen() -> None:
            heard = 0
            async for frame in stream.frames():
                now = time.monotonic()
                for j in range(heard, min(frame.heard, len(fed_at))):
                    latencies.append((fed_at[j], (now - fed_at[j]) * 1000))
                heard = max(heard, frame.heard)

        async with asyncio.TaskGroup() as tasks:
            speaking = tasks.create_task(speak())
            listening = tasks.create_task(listen())
            await asyncio.sleep(seconds)
            speaking.cancel()
            engine.leave(f"s{k}")  # ends its voice stream: the listener returns
            await listening

    await asyncio.gather(*(one(k) for k in range(sessions)))
    steps = stats.steps - steps_before
    late = stats.late_steps - late_before
    steady_ticks = [t for t in stats.recent if t.at >= settled]
    steady_late = sum(1 for t in steady_ticks if t.total > FRAME_S * 1000)
    result: dict[str, Any] = {
        "steps": steps,
        "late_steps": late,
        "skipped_in": stats.skipped_in - skipped_before,
        "steady": {"steps": len(steady_ticks), "over_frame": steady_late},
        "phases_ms": phases(steady_ticks),
    }
    steady = [ms for at, ms in latencies if at >= settled]
    if not steady:  # the model made no frame after hearing one: far behind
        return result | {
            "frames_heard": len(latencies),
            "latency_ms": None,
            "heard_by_client_ms": None,
            "whole_level_latency_ms": None,
            "real_time": False,
        }
    whole = [ms for _, ms in latencies]
    p50, p95 = statistics.median(steady), percentile(steady, 0.95)
    return result | {
        "frames_heard": len(latencies),
        "latency_ms": {"p50": p50, "p95": p95},
        "heard_by_client_ms": {"p50": p50 + MODEL_DELAY_MS, "p95": p95 + MODEL_DELAY_MS},
        "whole_level_latency_ms": {
            "p50": statistics.median(whole),
            "p95": percentile(whole, 0.95),
        },
        "real_time": bool(steady_ticks)
        and steady_late <= 0.01 * len(steady_ticks)
        and p95 <= 2 * FRAME_S * 1000,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.engines.moshi.duplex_engine import MoshiDuplexEngine

    counts = [int(n) for n in args.sessions.split(",")]
    graph = graph_from_args(args)
    graph.check()
    stage = graph.stage_by_engine("moshi.duplex") or graph.stage_names()[0]
    engine = MoshiDuplexEngine(**graph.engine_kwargs(stage))
    began = time.monotonic()
    await engine.start()
    report: dict[str, Any] = {
        **source_stamp(),
        "argv": vars(args),
        "graph": graph.report(),
        "rows": engine.rows,
        "start_s": time.monotonic() - began,
        "levels": {},
    }
    print("\n".join(header_lines(report["graph"])))
    print(f"engine started in {report['start_s']:.1f} s; the graph holds {engine.rows} sessions")
    try:
        for n in counts:
            if n > engine.rows:
                report["levels"][str(n)] = {"skipped": f"the graph holds {engine.rows} sessions"}
                print(f"  {n:3d} sessions: not run: the graph holds {engine.rows}", flush=True)
                continue
            result = await level(engine, n, args.seconds, args.settle)
            report["levels"][str(n)] = result
            lat, heard = result["latency_ms"], result["heard_by_client_ms"]
            if lat is None or heard is None:
                print(f"  {n:3d} sessions: no frame made after hearing one: BEHIND", flush=True)
                continue
            steady, parts = result["steady"], result["phases_ms"]
            work = " ".join(f"{k} {v['p50']:.1f}" for k, v in parts.items())
            print(
                f"  {n:3d} sessions: engine latency p50 {lat['p50']:6.1f} / p95 "
                f"{lat['p95']:6.1f} ms (as heard, with the model's 160 ms: p50 {heard['p50']:.0f})"
                f", frames over 80 ms {steady['over_frame']}/{steady['steps']} after the first "
                f"{args.settle:g} s ({result['late_steps']}/{result['steps']} late in all, "
                f"{result['skipped_in']} queued frames cut); tick p50 ms: {work}"
                f" {'real time' if result['real_time'] else 'BEHIND'}",
                flush=True,
            )
    finally:
        await engine.close()
    held = [n for n in counts if report["levels"][str(n)].get("real_time")]
    report["most_sessions_in_real_time"] = max(held) if held else 0
    print(
        f"most sessions held in real time: {report['most_sessions_in_real_time']}"
        f" (graph: {graph.note(stage)})"
    )
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_graph_options(p, "moshi", lengths=False)
    p.add_argument("--sessions", default="1,8,16,32")
    p.add_argument("--seconds", type=float, default=10.0, help="per level")
    p.add_argument("--settle", type=float, default=SETTLE_S, help="s left out at each start")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    report = asyncio.run(run(args))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
