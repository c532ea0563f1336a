"""Benchmark: a stage's worker stopped (SIGSTOP) mid-answer, until it serves again.

A request is started on the real pipeline; once its first text has come, the stage's worker
process is stopped with SIGSTOP, as a hung process would be. Two times run from the stop:
until the request's stream ends with its ErrorChunk (the client's failure, with the reason),
and until a new worker serves the stage (the hung one killed, a new one loaded and ready).
A request after that must complete. The bound is the stage's `hang_s` in the graph file.

    .venv/bin/python -m loadtest.hang_bench [--pipeline cascade] [--stage thinker] [--n 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time

import numpy as np

from pipeline.graph import StageGraph
from pipeline.registry import load_pipeline
from pipeline.types import End, ErrorChunk, PipelineRequest
from pipeline.worker import WorkerEngine

QUESTION = "Tell me a long story about a dragon who learns to cook."


def ask(rid: str) -> PipelineRequest:
    return PipelineRequest(
        request_id=rid, audio=np.zeros(0, dtype=np.int16), text=QUESTION, output_text_only=True
    )


async def one_trial(graph: StageGraph, stage: WorkerEngine, n: int) -> tuple[float, float, str]:
    old_pid = stage.pid
    assert old_pid is not None
    stream = graph.generate(ask(f"resp_hang{n}"))
    await anext(stream)
    os.kill(old_pid, signal.SIGSTOP)
    stopped = time.monotonic()
    async with asyncio.timeout(60):
        rest = [chunk async for chunk in stream]
    failed = time.monotonic() - stopped
    error = rest[-1]
    if not isinstance(error, ErrorChunk):
        raise RuntimeError(f"the request ended with {error!r}, not an error: too short?")
    async with asyncio.timeout(300):
        while True:
            if stage.pid not in (None, old_pid) and stage.down_reason is None:
                break
            await asyncio.sleep(0.01)
    replaced = time.monotonic() - stopped
    again = [chunk async for chunk in graph.generate(ask(f"resp_again{n}"))]
    if not isinstance(again[-1], End):
        raise RuntimeError(f"the request after the restart ended with {again[-1]!r}")
    return failed, replaced, error.message


async def main(pipeline: str, stage_name: str, n: int) -> None:
    graph = load_pipeline(pipeline)
    assert isinstance(graph, StageGraph)
    stage = graph.engines[stage_name]
    if not isinstance(stage, WorkerEngine):
        raise SystemExit(f"stage {stage_name} of {pipeline} is not in a worker process")
    hang_s = graph.config.stage(stage_name).hang_s
    await graph.start()
    try:
        results = [await one_trial(graph, stage, k) for k in range(n)]
    finally:
        await graph.close()
    print(f"{pipeline}, stage {stage_name} (hang_s {hang_s:g} s), SIGSTOP mid-answer, {n} trials")
    print(f"  the client was told: {results[0][2]}")
    failed = [r[0] for r in results]
    replaced = [r[1] for r in results]
    for label, times in (("request failed after", failed), ("new worker serving after", replaced)):
        print(
            f"  {label}: median {statistics.median(times):.2f} s, "
            f"min {min(times):.2f} s, max {max(times):.2f} s"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="cascade")
    parser.add_argument("--stage", default="thinker")
    parser.add_argument("--n", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.pipeline, args.stage, args.n))
