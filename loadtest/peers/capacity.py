"""Capacity: how many looping calls one server holds with < 1 % late outbound frames.

Per step N: N calls, started evenly over `stagger_s`, each looping "question, wait for the
answer to end, 0.3 s". After the last start and `warm_s`, a window of `window_s`: the
probe's late-frame count and the server's CPU over the window (100 % = one core), and the
answers heard (for Parley also its own late-frame count from /metrics, `own_late_pct`, as a
check on the probe). The client runs on the same cores as the server (it encodes and decodes
Opus for every call too), so a step's figures are a lower bound for the server alone.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

from loadtest.peers.measures import QUESTION, Target, ask, utterance
from pipeline.tasks import TaskSet

ANSWER_WITHIN_S = 15.0


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[int, ...]
    warm_s: float
    window_s: float
    stagger_s: float


def step_ok(row: dict[str, Any]) -> bool:
    return bool(
        row["connected"] == row["calls"]
        and row["late_pct"] < 1.0
        and row["answered_calls"] == row["calls"]
    )


async def own_late_frames(target: Target) -> tuple[float, float] | None:
    """Parley's own count (late, frames) from /metrics, to check the probe against it."""
    if target.peer != "parley":
        return None
    text = (await target.http.get("/metrics")).text
    found = dict(
        re.findall(r"^parley_webrtc_(late_frames|outbound_frames)_total (\S+)$", text, re.M)
    )
    if len(found) < 2:
        return None
    return float(found["late_frames"]), float(found["outbound_frames"])


async def step(target: Target, n: int, plan: Plan) -> dict[str, Any]:
    question = utterance(QUESTION)
    callers = [target.caller() for _ in range(n)]
    answers = [0] * n
    connected = [False] * n
    counting = asyncio.Event()

    async def talk(i: int) -> None:
        await asyncio.sleep(i * plan.stagger_s / max(1, n))
        caller = callers[i]
        await caller.call()
        connected[i] = True
        while True:
            end = await ask(caller, question)
            if await caller.wait_loud(end, ANSWER_WITHIN_S) is None:
                continue
            await caller.wait_quiet(0.6, within_s=30)
            if counting.is_set():
                answers[i] += 1
            await asyncio.sleep(0.3)

    try:
        async with TaskSet("capacity") as talkers:
            for i in range(n):
                talkers.create_task(talk(i))
            await asyncio.sleep(plan.stagger_s + plan.warm_s)
            before = await target.stats(reset=True)
            own_before = await own_late_frames(target)
            started = time.monotonic()
            counting.set()
            await asyncio.sleep(plan.window_s)
            after = await target.stats()
            wall = time.monotonic() - started
            own_after = await own_late_frames(target)
    finally:
        await asyncio.gather(*(c.close() for c in callers), return_exceptions=True)
    frames = after["frames"]
    own = None
    if own_before and own_after and own_after[1] > own_before[1]:
        own = round(100 * (own_after[0] - own_before[0]) / (own_after[1] - own_before[1]), 2)
    cpu_pct = 100 * (after["cpu_s"] - before["cpu_s"]) / wall
    return {
        "calls": n,
        "connected": sum(connected),
        "late_pct": round(100 * after["late"] / frames, 2) if frames else 100.0,
        "max_late_ms": after["max_late_ms"],
        "own_late_pct": own,
        "answers": sum(answers),
        "answered_calls": sum(1 for a in answers if a),
        "server_cpu_pct": round(cpu_pct, 1),
        "cpu_pct_per_call": round(cpu_pct / n, 1),
        "server_rss_mb": after["rss_mb"],
    }


async def capacity(target: Target, plan: Plan) -> dict[str, Any]:
    rows = []
    for n in plan.steps:
        row = await step(target, n, plan)
        row["ok"] = step_ok(row)
        rows.append(row)
        await asyncio.sleep(2.0)  # let the server close the step's calls
        if not row["ok"]:
            break
    held = [r["calls"] for r in rows if r["ok"]]
    return {"steps": rows, "max_ok_calls": max(held) if held else 0}
