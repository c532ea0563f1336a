"""The omni bench's command line (`python -m loadtest.omni_bench --help`): what it runs
(phases, concurrency levels, rounds), on what (model size, device, placement, GPU sharing),
with which engine settings (cache rows, batches, prefill, compile), and its limits.
`loadtest.omni_timeline`, `omni_prefill` and the tests build the same graph from it."""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "Benchmark: Qwen3-Omni through Parley's stage graph, and the plain transformers baseline."
)
PHASES = ("parley", "kv_reuse", "code2wav", "baseline")
LAYOUTS = ("one", "split", "replicas")
"""Where the graph's stages run (the `parley` phase once per layout asked for): all on
--device (`one`); the Thinker on --device and the Talker and Code2Wav on --second-device
(`split`, vLLM-Omni's two-GPU deployment); a Thinker replica on each device, sessions spread
over them, with the Talker and Code2Wav on --second-device (`replicas`)."""


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
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--device", default="cuda:0")
    p.add_argument(
        "--second-device", default="cuda:1", help="the other GPU of the split and replica layouts"
    )
    p.add_argument(
        "--layouts",
        type=layouts,
        default=["one"],
        help=f"the parley phase once per layout, any of {','.join(LAYOUTS)} (see LAYOUTS)",
    )
    p.add_argument("--layout", default="one", choices=LAYOUTS, help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--model-path", default=None)
    p.add_argument("--audio-s", type=float, default=10.0)
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--think-tokens", type=int, default=128)
    p.add_argument("--speech-s", type=float, default=10.0)
    p.add_argument("--first-chunk", type=int, default=5, help="Code2Wav's first chunk (frames)")
    p.add_argument("--chunk", type=int, default=25, help="Code2Wav's later chunks (frames)")
    p.add_argument("--left-context", type=int, default=25, help="Code2Wav's context (frames)")
    p.add_argument("--concurrency", type=levels, default=[1, 4, 10], help="levels, e.g. 1,4,10")
    p.add_argument("--reps", type=int, default=2, help="rounds per concurrency level")
    p.add_argument(
        "--min-requests",
        type=int,
        default=0,
        help="at least this many requests per level (more rounds where a level is small)",
    )
    p.add_argument(
        "--max-batch", type=int, default=None, help="steps batched (default: the top level)"
    )
    p.add_argument(
        "--decode-rows",
        type=int,
        default=16,
        help="requests decoding on static cache rows, captured as CUDA graphs (0: plain steps)",
    )
    p.add_argument("--max-context", type=int, default=4096, help="positions per cache row")
    p.add_argument(
        "--compile-predictor",
        action="store_true",
        help="the Talker's code predictor compiled (torch.compile) before it is captured",
    )
    p.add_argument(
        "--prefill-batch",
        type=int,
        default=None,
        help="the Thinker's prompts prefilled as one batch at most (default: --max-batch's)",
    )
    p.add_argument(
        "--talker-prefill-batch",
        type=int,
        default=0,
        help="the Talker's prefills gathered into one batch at most (0: its max batch)",
    )
    p.add_argument(
        "--prefill-chunk-tokens",
        type=int,
        default=0,
        help="a batched prefill runs this many positions at a time, decode steps between "
        "(0: whole)",
    )
    p.add_argument(
        "--placement",
        choices=["worker", "main", "subgraph"],
        default="worker",
        help="each stage in its own worker process, all in the bench's process, or all in "
        "one worker process (a subgraph: the stages overlap on the GPU, each on its stream)",
    )
    p.add_argument(
        "--gpu-sharing",
        choices=["none", "mps"],
        default="none",
        help="how the stage processes share the GPU: CUDA's time slices, or an MPS daemon "
        "the graph starts (their kernels side by side; --placement worker)",
    )
    p.add_argument(
        "--audio-priority",
        choices=["normal", "high"],
        default="normal",
        help="the CUDA stream priority of the Talker and Code2Wav (high: their kernels go "
        "ahead of the Thinker's where the stages share a process)",
    )
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="with --placement subgraph: the GIL switch interval of the group's process",
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
