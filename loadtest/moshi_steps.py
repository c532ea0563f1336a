"""How many full-duplex sessions one model holds: Moshi's 80 ms frame step, per batch size.

Every 80 ms a duplex model must read one frame of each live session's microphone and write
one frame of its voice; a step that takes longer than the frame falls behind real time. For
each batch size this times the whole frame (Mimi encoding each session's microphone frame,
the frame step of the main and depth transformers for all sessions at once, Mimi decoding
each voice frame) and its three parts, with every session's cache window full (the slowest
case: four minutes into a conversation), and reports the largest batch whose p95 frame
fits in 80 ms.

It measures a graph file, `--pipeline` (pipeline/configs/moshi.yaml by default): the
engine is built from its stage's arguments and loads as the server's does (its rows sized to
the card where the file says `auto`, its frame steps and codec captured as CUDA graphs on a
GPU). A batch larger than the rows the graph holds is not timed: the report says so. What
the command changes (`--set moshi.KEY=VALUE`, `--device`, `--model-path`) is an override,
printed with the figures (bench_graph.py). Mimi streams with each session's state: a frame
of codec work a frame, the same at any point of a conversation (its transformers attend
over a ring of fixed size, full or not).

    python -m loadtest.moshi_steps --batches 1,8,16,32,48,64          # on the GPU
    python -m loadtest.moshi_steps --pipeline moshi_tiny --batches 1,4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .bench_graph import add_graph_options, graph_from_args, header_lines
from .run_stamp import source_stamp

FRAME_MS = 80.0


def timed(device: torch.device, work: Any) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    out = work()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - began) * 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from pipeline.engines.moshi.duplex_engine import MoshiDuplexEngine
    from pipeline.engines.moshi.mimi_frames import FRAME_SAMPLES

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_graph_options(p, "moshi", lengths=False)
    p.add_argument("--batches", default="1,8,16,32,48,64")
    p.add_argument("--steps", type=int, default=20, help="timed frames per batch size")
    p.add_argument("--warm", type=int, default=3, help="frames before timing")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    graph = graph_from_args(args)
    graph.check()
    stage = graph.stage_by_engine("moshi.duplex") or graph.stage_names()[0]
    engine = MoshiDuplexEngine(**graph.engine_kwargs(stage))
    began = time.perf_counter()
    engine._load()  # as the server's engine loads: sized, captured (here: this thread)
    stepper, codec = engine._stepper, engine._codec
    assert stepper is not None and codec is not None
    model = stepper.model
    device = next(model.parameters()).device
    report: dict[str, Any] = {
        **source_stamp(),
        "argv": vars(args),
        "graph": graph.report(),
        "torch": torch.__version__,
        "rows": engine.rows,
        "build_s": time.perf_counter() - began,
        "parameters_b": sum(p.numel() for p in model.parameters()) / 1e9,
        "codec_captured": codec.captured,
        "levels": {},
    }
    note = graph.note(stage)
    print("\n".join(header_lines(report["graph"])))
    print(
        f"model built, sized and captured in {report['build_s']:.1f} s"
        f" ({report['parameters_b']:.2f} B parameters); the graph holds {engine.rows} sessions"
    )
    window = stepper.cache.window
    rng = np.random.default_rng(0)
    mic = (rng.standard_normal(FRAME_SAMPLES) * 2000).astype(np.int16)
    for n in batches:
        if n > engine.rows:
            report["levels"][str(n)] = {"skipped": f"the graph holds {engine.rows} sessions"}
            print(f"  {n:3d} sessions: not timed: the graph holds {engine.rows}")
            continue
        ids = [f"s{i}" for i in range(n)]
        for s in ids:
            stepper.join(s)
        stepper.cache.written[:n] = window  # a full window: the slowest steady state
        parts: dict[str, list[float]] = {"encode": [], "step": [], "decode": [], "frame": []}
        for k in range(args.warm + args.steps):
            heard = {s: mic for s in ids}
            codes, encode_ms = timed(device, lambda h=heard: codec.encode(h))
            out, step_ms = timed(device, lambda c=codes: stepper.step(c))
            voice = {s: o.codes for s, o in out.items() if o.codes is not None}
            _, decode_ms = timed(device, lambda v=voice: codec.decode(v))
            if k >= args.warm:
                parts["encode"].append(encode_ms)
                parts["step"].append(step_ms)
                parts["decode"].append(decode_ms)
                parts["frame"].append(encode_ms + step_ms + decode_ms)
        level: dict[str, Any] = {
            f"{name}_ms": {
                "p50": statistics.median(values),
                "p95": percentile(values, 0.95),
            }
            for name, values in parts.items()
        }
        level["real_time"] = level["frame_ms"]["p95"] <= FRAME_MS
        report["levels"][str(n)] = level
        f = level["frame_ms"]
        verdict = "real time" if level["real_time"] else "BEHIND"
        print(
            f"  {n:3d} sessions: frame p50 {f['p50']:6.1f} / p95 {f['p95']:6.1f} ms "
            f"(encode {level['encode_ms']['p50']:.1f}, step {level['step_ms']['p50']:.1f}, "
            f"decode {level['decode_ms']['p50']:.1f}) {verdict}",
            flush=True,
        )
        for s in ids:
            stepper.leave(s)
            codec.forget(s)
    held = [n for n in batches if report["levels"][str(n)].get("real_time")]
    report["most_sessions_in_real_time"] = max(held) if held else 0
    print(
        f"most sessions within the {FRAME_MS:g} ms frame: {report['most_sessions_in_real_time']}"
        f" (graph: {note})"
    )
    if device.type == "cuda":
        report["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
