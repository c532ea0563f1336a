"""Benchmark: Qwen3-Omni through Parley's stage graph, and the plain transformers baseline.

It measures a graph file: `--pipeline` (pipeline/configs/qwen3_omni.yaml by default) with
every engine setting as the file gives it (each stage's context, rows, batches, session KV,
Code2Wav's chunks and batch). Whatever the command changes is an override, printed in the
report's header and beside every figure it affects (bench_graph.py): `--think-tokens` and
`--speech-s` (random weights never stop by themselves, so their answers need a length),
`--set STAGE.KEY=VALUE`, `--device`, `--model-path`, `--placement`, `--layouts`. Without
`--model-path` the full-size architecture runs with random bf16 weights. One fixed input
(seconds of 16 kHz audio, a few camera frames and a typed question). Phases, each in its own
process so that one's GPU memory is free for the next:

- `parley`: the graph (each stage where the file places it) is started once, warmed up,
  then answers each `--concurrency` level in turn (`--reps` rounds of that many requests
  at once), streamed: time to the first audio chunk and to the first text, the real-time
  factor (wall time / audio produced), Thinker tokens/s and Talker frames/s (per request
  and aggregate), the time between audio chunks, playback stalls, peak GPU memory.
- `kv_reuse`: the graph's Thinker alone: a follow-up turn's prefill with and without KV
  reuse (loadtest/omni_bench_engines.py).
- `code2wav`: the graph's Code2Wav alone: its time per chunk at each level (batched at most
  as the file's `max_batch` says).
- `baseline`: transformers' `generate` on the same input (omni_baseline.py): it does not
  stream, so its figure is the time to its finished answer.

    python -m loadtest.omni_bench --think-tokens 128 --speech-s 10 --out bench.json   # GPU
    python -m loadtest.omni_bench --pipeline qwen3_omni_tiny                 # the plumbing, here
    python -m loadtest.omni_bench --merge a.json b.json --out all.json   # phases run apart
    python -m loadtest.omni_bench --pipeline qwen3_omni_2gpu --layouts file,replicas ...
        # two GPUs: the parley phase once per layout (omni_bench_options.LAYOUTS), in one run

prints one table and writes everything, with the header that makes it reproducible, as JSON.
`--time-limit-s` bounds the whole command: a phase starts no round it cannot finish in time
(judged by the last round), and one still running at the limit is stopped; every phase
writes what it has after each level, so a stopped phase still reports its finished levels.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .omni_baseline import baseline_phase
from .omni_bench_engines import code2wav_phase, kv_reuse_phase
from .omni_bench_gpu import GpuMemoryPoller
from .omni_bench_input import QUESTION, make_request, out_of_time
from .omni_bench_options import PHASES, parser
from .omni_bench_report import level_figures, merge, request_record, table_lines
from .omni_graph import flat_graph, omni_graph, phase_devices
from .run_stamp import command_output, source_stamp

STOP_GRACE_S = 60.0
"""How long a phase stopped at the time limit gets to close its stages."""
PHASE_STAGES: dict[str, tuple[str, ...]] = {
    "parley": (),  # every stage
    "kv_reuse": ("thinker",),
    "code2wav": ("code2wav", "talker"),  # the Talker's speech length is its input
    "baseline": ("thinker", "talker"),
}
"""The stages whose settings (and overrides) each phase's figures depend on."""


def header(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    graph = omni_graph(args)
    info: dict[str, Any] = {
        **source_stamp(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "graph": graph.report(),
        "input": {
            "audio_s": args.audio_s,
            "frames": args.frames,
            "frame_size": [224, 224],
            "question": QUESTION,
        },
        "warmup_requests": args.warmup,
        "layouts": args.layouts,
        "concurrency": args.concurrency,
        "reps_per_level": args.reps,
        "min_requests_per_level": args.min_requests,
        "baseline_reps": args.baseline_reps,
        "kv_turns": args.kv_turns,
        "kv_reps": args.kv_reps,
        "phases": args.phases,
        "time_limit_s": args.time_limit_s,
        "argv": sys.argv,
    }
    devices = phase_devices(args, "file")
    if any(d.startswith("cuda") for d in devices):
        info["gpu"] = command_output(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        )
    return info


# --- Parley's graph ------------------------------------------------------------------------


def rounds_at(args: argparse.Namespace, concurrency: int) -> int:
    """`--reps` rounds, or more where `--min-requests` asks for more requests at a level."""
    return max(int(args.reps), -(-int(args.min_requests) // concurrency))


def phase_name(phase: str, layout: str) -> str:
    """The report's key for a phase: the parley phase's gets its layout, except `one`."""
    return f"{phase}_{layout}" if phase == "parley" and layout != "file" else phase


async def one_request(graph: Any, request: Any, rep: int) -> dict[str, Any]:
    from pipeline.types import AudioChunk, End, ErrorChunk, TextDelta

    started = time.perf_counter()
    text_times: list[float] = []
    audio: list[tuple[float, float]] = []
    error = None
    async for chunk in graph.generate(request):
        now = time.perf_counter() - started
        if isinstance(chunk, TextDelta) and chunk.kind == "output":
            text_times.append(now)
        elif isinstance(chunk, AudioChunk):
            audio.append((now, chunk.duration_ms / 1000))
        elif isinstance(chunk, ErrorChunk):
            error = chunk.message
        elif isinstance(chunk, End):
            break
    total = time.perf_counter() - started
    return request_record(text_times=text_times, audio=audio, total_s=total, error=error, rep=rep)


async def parley_phase(
    args: argparse.Namespace, partial: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    from pipeline.graph import StageGraph
    from pipeline.registry import load_pipeline

    path = omni_graph(args, args.layout).write(Path(tempfile.mkdtemp(prefix="omni-bench-")))
    result: dict[str, Any] = {}
    with GpuMemoryPoller(phase_devices(args, args.layout)) as memory:
        built = time.perf_counter()
        graph = load_pipeline(str(path))
        assert isinstance(graph, StageGraph)
        await graph.start()
        result["start_s"] = time.perf_counter() - built
        result["peak_gpu_after_start_gib"] = memory.peak()
        try:
            warmed = time.perf_counter()
            for index in range(args.warmup):
                warm = await one_request(graph, make_request(10_000 + index, args), -1)
                if warm["error"]:
                    raise RuntimeError(f"warm-up failed: {warm['error']}")
            result["warmup_s"] = time.perf_counter() - warmed
            round_s, last_level = result["warmup_s"] / max(args.warmup, 1), 1
            for concurrency in args.concurrency:
                key = f"c{concurrency}"
                level_started = time.perf_counter()
                runs: list[dict[str, Any]] = []
                # a round's time, judged by the last round's, grown with the concurrency
                round_s *= max(1.0, concurrency / last_level)
                last_level = concurrency
                result[key] = {"skipped": "time limit"}
                for rep in range(rounds_at(args, concurrency)):
                    if out_of_time(args, round_s):
                        break
                    requests = [make_request(1000 * rep + i, args) for i in range(concurrency)]
                    began = time.perf_counter()
                    runs += await asyncio.gather(*(one_request(graph, r, rep) for r in requests))
                    round_s = time.perf_counter() - began
                    result[key] = level_figures(runs)
                    result[key]["reps_done"] = rep + 1
                    result[key]["peak_gpu_used_gib"] = memory.peak(level_started)
                    partial(result)  # kept if the phase is stopped later
                print(f"parley {key}: {json.dumps(result[key])}", flush=True)
                partial(result)
        finally:
            await graph.close()
            shutil.rmtree(path.parent, ignore_errors=True)  # the phase's graph file: scratch
        result["peak_gpu_used_gib"] = memory.peak()
    return result


# --- the driver ----------------------------------------------------------------------------


def run_phase_in_child(
    phase: str, argv: list[str], args: argparse.Namespace, layout: str = "file"
) -> dict[str, Any]:
    """One phase in a fresh process (its GPU memory is all free again when it exits).

    The child writes its results after each level; at the time limit it is asked to stop
    (SIGTERM: it closes its stages), then killed, and what it wrote is kept."""
    out = Path(tempfile.mkdtemp(prefix="omni-bench-")) / f"{phase}.json"
    command = [sys.executable, "-m", "loadtest.omni_bench", *argv, "--phase", phase]
    command += ["--phase-out", str(out)]
    if args.deadline_epoch is not None:
        command += ["--deadline-epoch", str(args.deadline_epoch)]
    stopped = None
    with GpuMemoryPoller(phase_devices(args, layout)) as memory, subprocess.Popen(command) as child:
        while child.poll() is None:
            if args.deadline_epoch is not None and time.time() > args.deadline_epoch:
                stopped = "stopped at the time limit"
                child.terminate()
                try:
                    child.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    child.kill()
                break
            time.sleep(0.5)
        child.wait()
        peak = memory.peak()
    result: dict[str, Any] = {}
    if out.is_file():
        result = json.loads(out.read_text())
    shutil.rmtree(out.parent, ignore_errors=True)  # read into the report: scratch
    if stopped is not None:
        result["error"] = stopped
    elif child.returncode != 0:
        result["error"] = f"phase {phase} exited {child.returncode}"
    result["peak_gpu_used_gib"] = peak
    return result


def print_table(report: dict[str, Any]) -> None:
    print()
    print("\n".join(table_lines(report)))


def run_phase(args: argparse.Namespace) -> None:
    """In the child: one phase, its results written to --phase-out (also after each level)."""
    out = Path(args.phase_out)

    def partial(result: dict[str, Any]) -> None:
        ready = out.with_suffix(".part")
        ready.write_text(json.dumps(result))
        ready.replace(out)  # whole or not at all, if the phase is stopped while writing

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(f"stopped by signal {signum}")  # unwinds through the phase's finally

    signal.signal(signal.SIGTERM, stop)
    result: dict[str, Any]
    if args.phase == "parley":
        result = asyncio.run(parley_phase(args, partial))
    elif args.phase == "kv_reuse":
        result = asyncio.run(kv_reuse_phase(args))
    elif args.phase == "code2wav":
        result = asyncio.run(code2wav_phase(args))
    else:
        result = baseline_phase(args)
    partial(result)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.phase is not None:
        run_phase(args)
        return
    if args.merge:
        merged = merge([json.loads(Path(name).read_text()) for name in args.merge])
        Path(args.out).write_text(json.dumps(merged, indent=1))
        print_table(merged)
        print(f"\nmerged report: {args.out}")
        return
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phases: {', '.join(sorted(unknown))}")
    child_argv = list(sys.argv[1:] if argv is None else argv)
    if args.time_limit_s is not None:
        args.deadline_epoch = time.time() + args.time_limit_s
    # every layout's graph checked before anything runs (a contradiction names its field)
    graphs = {layout: omni_graph(args, layout) for layout in args.layouts}
    report: dict[str, Any] = {"header": header(args)}
    runs = [
        (phase, layout)
        for phase in phases
        for layout in (args.layouts if phase == "parley" else ["file"])
    ]
    for phase, layout in runs:
        name = phase_name(phase, layout)
        started = time.perf_counter()
        if out_of_time(args):
            report[name] = {"error": "not started: time limit"}
            continue
        report[name] = run_phase_in_child(phase, [*child_argv, "--layout", layout], args, layout)
        report[name]["phase_s"] = time.perf_counter() - started
        graph = graphs[layout] if phase == "parley" else flat_graph(args)
        report[name]["graph_note"] = graph.note(*PHASE_STAGES[phase])
        if layout != "file":
            report[name]["graph"] = graph.report()
        Path(args.out).write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"\nfull report: {args.out}")


if __name__ == "__main__":
    main()
