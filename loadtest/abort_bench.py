"""Benchmark: abort, from cancelling a request to every stage holding nothing for it.

A request is started on the real pipeline and cancelled while it is in a given phase:
`thinking` (before any text), `talking` (text out, no audio yet) or `speaking` (audio out).
The time runs from `aclose()` on the output stream until `aclose()` has returned and every
stage (worker stages asked over their link) reports no active request.

    .venv/bin/python -m loadtest.abort_bench [--pipeline cascade] [--n 30]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from pipeline.graph import StageGraph
from pipeline.registry import load_pipeline
from pipeline.types import AudioChunk, PipelineRequest, TextDelta
from pipeline.worker import WorkerEngine

from .speech import speak, trim_silence

PHASES = ("thinking", "talking", "speaking")
QUESTION = "Tell me a long story about a dragon who learns to cook."


async def stages_idle(graph: StageGraph) -> None:
    """Return once no stage holds a request (worker and remote stages asked over their link)."""
    while True:
        busy = graph.active_requests()
        for engine in graph.engines.values():
            if isinstance(engine, WorkerEngine):
                busy += await engine.remote_active_requests()
        if busy == 0:
            return
        await asyncio.sleep(0.0005)


async def abort_once(graph: StageGraph, phase: str, index: int, audio: np.ndarray) -> float | None:
    request = PipelineRequest(request_id=f"resp_abort_{phase}_{index}", audio=audio)
    stream = graph.generate(request)
    reached = phase == "thinking"
    if reached:
        await asyncio.sleep(0.05)  # in flight, before the first output
    else:
        async for chunk in stream:
            if phase == "talking" and isinstance(chunk, TextDelta) and chunk.kind == "output":
                reached = True
                break
            if isinstance(chunk, AudioChunk):
                reached = phase == "speaking"
                break
    if not reached:
        await stream.aclose()
        return None
    started = time.perf_counter()
    await stream.aclose()
    await stages_idle(graph)
    return (time.perf_counter() - started) * 1000


async def run(pipeline: str, n: int) -> dict[str, dict[str, float]]:
    graph = load_pipeline(pipeline)
    assert isinstance(graph, StageGraph)
    await graph.start()
    audio = np.concatenate([trim_silence(speak(QUESTION)), np.zeros(3200, dtype=np.int16)])
    figures: dict[str, dict[str, float]] = {}
    try:
        for phase in PHASES:
            samples = [
                t for i in range(n) if (t := await abort_once(graph, phase, i, audio)) is not None
            ]
            if samples:
                figures[phase] = {
                    "n": len(samples),
                    "p50_ms": float(np.percentile(samples, 50)),
                    "p99_ms": float(np.percentile(samples, 99)),
                }
    finally:
        await graph.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description="abort latency through the stage graph")
    parser.add_argument("--pipeline", default="cascade")
    parser.add_argument("--n", type=int, default=30)
    args = parser.parse_args()
    figures = asyncio.run(run(args.pipeline, args.n))
    print(f"abort -> every stage idle, pipeline {args.pipeline}")
    for phase, f in figures.items():
        print(f"  {phase:9} n={f['n']:<4.0f} p50 {f['p50_ms']:7.2f} ms   p99 {f['p99_ms']:7.2f} ms")


if __name__ == "__main__":
    main()
