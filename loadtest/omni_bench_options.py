"""The omni bench's command line (`python -m loadtest.omni_bench --help`): the graph file it
measures and the overrides asked for (bench_graph.py: each one printed in the report), what it
runs (phases, concurrency levels, rounds), the input, and its limits. `loadtest.omni_timeline`
and the tests build the same graph from it (omni_graph.py)."""

from __future__ import annotations

import argparse

from .bench_graph import add_graph_options

DESCRIPTION = (
    "Benchmark: Qwen3-Omni through Parley's stage graph, and the plain transformers baseline."
)
PHASES = ("parley", "kv_reuse", "code2wav", "baseline")
LAYOUTS = ("file", "split", "replicas")
"""Where the graph's stages run (the `parley` phase once per layout asked for): where the file
puts them (`one`); the Thinker where the file puts it and the Talker and Code2Wav on
--second-device (`split`, vLLM-Omni's two-GPU deployment); a Thinker replica on each device,
sessions spread over them, with the Talker and Code2Wav on --second-device (`replicas`).
`split` and `replicas` are overrides of the file's placement, printed as such."""


def layouts(text: str) -> list[str]:
    found = [x.strip() for x in text.split(",") if x.strip()]
    unknown = sorted(set(found) - set(LAYOUTS))
    if unknown or not found:
        raise argparse.ArgumentTypeError(f"layouts are any of {', '.join(LAYOUTS)}")
    return found


def levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=DESCRIPTION)
    add_graph_options(p, "qwen3_omni", lengths=True)
    p.add_argument(
        "--second-device", default="cuda:1", help="the other GPU of the split and replica layouts"
    )
    p.add_argument(
        "--layouts",
        type=layouts,
        default=["file"],
        help=f"the parley phase once per layout, any of {','.join(LAYOUTS)} (see LAYOUTS)",
    )
    p.add_argument("--layout", default="file", choices=LAYOUTS, help=argparse.SUPPRESS)
    p.add_argument(
        "--placement",
        choices=["worker", "main", "subgraph"],
        default=None,
        help="an override: each stage in its own worker process, all in the bench's process, "
        "or all in one worker process (a subgraph: the stages overlap on the GPU, each on its "
        "stream); default: where the file places them",
    )
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="with --placement subgraph: the GIL switch interval of the group's process",
    )
    p.add_argument("--audio-s", type=float, default=10.0, help="the question's audio (input)")
    p.add_argument("--frames", type=int, default=4, help="camera frames with it (input)")
    p.add_argument("--concurrency", type=levels, default=[1, 4, 10], help="levels, e.g. 1,4,10")
    p.add_argument("--reps", type=int, default=2, help="rounds per concurrency level")
    p.add_argument(
        "--min-requests",
        type=int,
        default=0,
        help="at least this many requests per level (more rounds where a level is small)",
    )
    p.add_argument("--baseline-reps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--kv-turns", type=int, default=3, help="turns per session in kv_reuse")
    p.add_argument("--kv-reps", type=int, default=2, help="sessions timed in kv_reuse")
    p.add_argument("--phases", default=",".join(PHASES), help=f"any of {','.join(PHASES)}")
    p.add_argument("--time-limit-s", type=float, default=None, help="for the whole command")
    p.add_argument("--merge", nargs="+", default=None, help="reports to join into --out")
    p.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    p.add_argument("--phase-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline-epoch", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default="omni_bench.json")
    return p
