"""Benchmark: worker memory over many aborted answers (does it plateau or leak?).

Runs the real pipeline and starts N answers to a spoken question, each aborted once it is
under way (alternating: while the Thinker writes text, and once audio flows), and samples
each worker process's resident memory after every abort. A leak grows without bound; a
warm-up (allocator arenas, torch's caches, the first batch shapes) grows and then stays.

    .venv/bin/python -m loadtest.worker_memory [--pipeline cascade] [--n 60]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from pathlib import Path

import numpy as np

from pipeline.graph import StageGraph
from pipeline.registry import load_pipeline
from pipeline.types import AudioChunk, PipelineRequest, TextDelta
from pipeline.worker import WorkerEngine

from .abort_bench import QUESTION, stages_idle
from .speech import speak, trim_silence


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def answer_then_abort(graph: StageGraph, index: int, audio: np.ndarray) -> None:
    """Start an answer and abort it at text (even `index`) or at audio (odd)."""
    stream = graph.generate(PipelineRequest(request_id=f"resp_mem_{index}", audio=audio))
    want_audio = index % 2 == 1
    async for chunk in stream:
        if isinstance(chunk, AudioChunk) or (
            not want_audio and isinstance(chunk, TextDelta) and chunk.kind == "output"
        ):
            break
    await stream.aclose()
    await stages_idle(graph)


async def run(pipeline: str, n: int) -> dict[str, list[float]]:
    graph = load_pipeline(pipeline)
    assert isinstance(graph, StageGraph)
    await graph.start()
    workers = {
        name: engine for name, engine in graph.engines.items() if isinstance(engine, WorkerEngine)
    }
    audio = np.concatenate([trim_silence(speak(QUESTION)), np.zeros(3200, dtype=np.int16)])
    series: dict[str, list[float]] = {name: [] for name in workers}
    try:
        for name, engine in workers.items():
            assert engine.pid is not None
            series[name].append(rss_mb(engine.pid))
        for index in range(n):
            await answer_then_abort(graph, index, audio)
            gc.collect()
            for name, engine in workers.items():
                assert engine.pid is not None
                series[name].append(rss_mb(engine.pid))
    finally:
        await graph.close()
    return series


def main() -> None:
    parser = argparse.ArgumentParser(description="worker RSS over aborted answers")
    parser.add_argument("--pipeline", default="cascade")
    parser.add_argument("--n", type=int, default=60)
    args = parser.parse_args()
    series = asyncio.run(run(args.pipeline, args.n))
    print(f"worker RSS (MB) over {args.n} aborted answers, pipeline {args.pipeline}")
    for name, values in series.items():
        marks = [0, 1, 5, 10, 20, 40, len(values) - 1]
        points = "  ".join(f"#{i}: {values[i]:.0f}" for i in marks if i < len(values))
        tail = values[len(values) // 2 :]
        print(f"  {name:9} {points}")
        print(
            f"  {'':9} growth over the second half: {tail[-1] - tail[0]:+.0f} MB "
            f"(max {max(values):.0f} MB)"
        )


if __name__ == "__main__":
    main()
