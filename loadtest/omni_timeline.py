"""Where the time to first audio goes: one Qwen3-Omni request's milestones, stage by stage.

The omni bench says how long first audio takes; this says why. It builds the bench's graph
(`--pipeline`, qwen3_omni.yaml by default, with the same overrides, each printed: see
loadtest/omni_graph.py; the same input), and notes when each stage's chunks reach the graph
(for a stage in a worker process: when they arrive from it, a fraction of a millisecond
after they were made):

- `thinker prompt`: the Thinker's prompt hidden states, i.e. its prefill done (log-mel
  features, image patches, the prompt's forward);
- `first text`: its first reply token; `thinker reply 1`: that token fed (what the Talker
  needs to start);
- `talker frame 1` and `talker frame N` (N: Code2Wav's first chunk);
- `first audio`: Code2Wav's first chunk;

then the intervals between the Thinker's reply tokens and between the Talker's frames.
`--placement main` (an override) runs the stages in this process, as a group (`subgraph`)
runs them in one worker; without it they run where the file places them.

    python -m loadtest.omni_timeline --think-tokens 128 --speech-s 10 --concurrency 1,10
    python -m loadtest.omni_timeline --pipeline qwen3_omni_tiny --think-tokens 8  # here
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

from .bench_graph import header_lines
from .omni_bench_input import make_request
from .omni_bench_options import parser as bench_parser
from .omni_graph import engine_setting, omni_graph

Marks = dict[str, list[float]]
"""Per request id: per milestone, the times (s since the request began) it was seen."""


def watch(graph: Any, began: dict[str, float], marks: dict[str, Marks]) -> None:
    """Wrap each stage's `generate` so that every chunk it yields is noted by kind."""
    from pipeline.types import AudioChunk, CodecCodes, HiddenStates, TextDelta

    def noted(stage: str, generate: Callable[..., AsyncGenerator[Any, None]]) -> Any:
        async def timed(request_id: str, inputs: Any, /) -> AsyncGenerator[Any, None]:
            async for chunk in generate(request_id, inputs):
                now = time.perf_counter() - began.get(request_id, time.perf_counter())
                kind = None
                match chunk:
                    case HiddenStates(metadata={"part": part}):
                        kind = f"{stage} {part}"
                    case TextDelta(kind="output"):
                        kind = "text"
                    case CodecCodes():
                        kind = f"{stage} frame"
                    case AudioChunk():
                        kind = f"{stage} audio"
                if kind is not None:
                    marks.setdefault(request_id, {}).setdefault(kind, []).append(now)
                yield chunk

        return timed

    for name, engine in graph.engines.items():
        setattr(engine, "generate", noted(name, engine.generate))  # noqa: B010 (an instance's)


def milestones(seen: Marks, first_chunk: int) -> dict[str, float]:
    """One request's milestones in ms (absent ones left out)."""
    out: dict[str, float] = {}

    def at(label: str, kind: str, index: int = 0) -> None:
        times = seen.get(kind, [])
        if len(times) > index:
            out[label] = times[index] * 1000

    at("thinker prompt", "thinker prompt")
    at("first text", "text")
    at("thinker reply 1", "thinker reply")
    at("talker frame 1", "talker frame")
    at(f"talker frame {first_chunk}", "talker frame", first_chunk - 1)
    at("first audio", "code2wav audio")
    gaps_of = (("thinker token gap", "thinker reply"), ("talker frame gap", "talker frame"))
    for label, kind in gaps_of:
        times = seen.get(kind, [])
        gaps = [(b - a) * 1000 for a, b in zip(times, times[1:], strict=False)]
        if gaps:
            out[label] = statistics.median(gaps)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.graph import StageGraph
    from pipeline.registry import load_pipeline

    bench = omni_graph(args)
    first_chunk = int(engine_setting(bench, "code2wav", "first_chunk", 5))
    scratch = Path(tempfile.mkdtemp(prefix="omni-timeline-"))
    graph = load_pipeline(str(bench.write(scratch)))
    assert isinstance(graph, StageGraph)
    began: dict[str, float] = {}
    marks: dict[str, Marks] = {}
    watch(graph, began, marks)
    await graph.start()
    report: dict[str, Any] = {"graph": bench.report(), "graph_note": bench.note()}
    try:
        for index in range(args.warmup):
            await answer(graph, make_request(90_000 + index, args), began)
        for concurrency in args.concurrency:
            requests = [
                make_request(1000 * rep + i, args)
                for rep in range(args.reps)
                for i in range(concurrency)
            ]
            rounds = [requests[i : i + concurrency] for i in range(0, len(requests), concurrency)]
            for batch in rounds:
                await asyncio.gather(*(answer(graph, r, began) for r in batch))
            rows = [milestones(marks[r.request_id], first_chunk) for r in requests]
            report[f"c{concurrency}"] = {
                label: statistics.median(row[label] for row in rows if label in row)
                for label in rows[0]
            }
            print(f"c{concurrency}: {json.dumps(report[f'c{concurrency}'])}", flush=True)
    finally:
        await graph.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return report


async def answer(graph: Any, request: Any, began: dict[str, float]) -> None:
    from pipeline.types import End, ErrorChunk

    began[request.request_id] = time.perf_counter()
    async for chunk in graph.generate(request):
        if isinstance(chunk, ErrorChunk):
            raise RuntimeError(f"{request.request_id}: {chunk.message}")
        if isinstance(chunk, End):
            return


def print_table(report: dict[str, Any]) -> None:
    levels = [key for key in report if key[:1] == "c" and key[1:].isdigit()]
    labels = list(report[levels[0]]) if levels else []
    print("\n".join(header_lines(report["graph"])))
    print(f"median ms from the request, per concurrency; graph: {report['graph_note']}")
    print(f"  {'milestone':<22}" + "".join(f"{level:>10}" for level in levels))
    for label in labels:
        cells = "".join(f"{report[level].get(label, float('nan')):>10.1f}" for level in levels)
        print(f"  {label:<22}{cells}")


def main(argv: list[str] | None = None) -> None:
    p = bench_parser()
    p.description = (__doc__ or "").split("\n")[0]
    args = p.parse_args(argv)
    if args.placement == "subgraph":
        p.error("--placement subgraph hides its stages in one worker: use main to time a group")
    report = asyncio.run(run(args))
    print_table(report)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
