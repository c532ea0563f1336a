"""How many full-duplex sessions one model holds: Moshi's 80 ms frame step, per batch size.

Every 80 ms a duplex model must read one frame of each live session's microphone and write
one frame of its voice; a step that takes longer than the frame falls behind real time. For
each batch size this times the whole frame (Mimi encoding each session's microphone frame,
the frame step of the main and depth transformers for all sessions at once, Mimi decoding
each voice frame) and its three parts, with every session's cache window full (the slowest
case: four minutes into a conversation), and reports the largest batch whose p95 frame
fits in 80 ms. On a GPU the frame step replays CUDA graphs captured before timing.

    python -m loadtest.moshi_steps --batches 1,8,16,32,48,64          # on the GPU
    python -m loadtest.moshi_steps --tiny --device cpu --dtype float32 --batches 1,4
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

FRAME_MS = 80.0
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


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
    from pipeline.engines.moshi.frame_step import FrameStepper
    from pipeline.engines.moshi.mimi_frames import FRAME_SAMPLES, MimiFrames
    from pipeline.engines.moshi.weights import load_moshi

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--model-path", default=None)
    p.add_argument("--batches", default="1,8,16,32,48,64")
    p.add_argument("--steps", type=int, default=20, help="timed frames per batch size")
    p.add_argument("--warm", type=int, default=3, help="frames before timing")
    p.add_argument("--context", type=int, default=4, help="codec frames of context")
    p.add_argument("--eager-codec", action="store_true", help="the codec uncaptured, unpadded")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    began = time.perf_counter()
    model = load_moshi(
        tiny=args.tiny, device=args.device, dtype=DTYPES[args.dtype], model_path=args.model_path
    )
    device = next(model.parameters()).device
    report: dict[str, Any] = {
        "argv": vars(args),
        "torch": torch.__version__,
        "build_s": time.perf_counter() - began,
        "parameters_b": sum(p.numel() for p in model.parameters()) / 1e9,
        "levels": {},
    }
    print(f"model built in {report['build_s']:.1f} s ({report['parameters_b']:.2f} B parameters)")
    stepper = FrameStepper(model, rows=max(batches))
    warmed = time.perf_counter()
    stepper.warm()  # every bucket captured (on a GPU) before anything is timed
    report["warm_s"] = time.perf_counter() - warmed
    print(f"frame steps captured in {report['warm_s']:.1f} s")
    codec = MimiFrames(
        model.audio_encoder,
        codebooks=stepper.codebooks,
        context=args.context,
        largest=None if args.eager_codec else max(batches),
    )
    codec.warm()  # on a GPU: the codec's buckets captured too, as the engine does
    report["codec_captured"] = codec.captured
    window = stepper.cache.window
    rng = np.random.default_rng(0)
    mic = (rng.standard_normal(FRAME_SAMPLES) * 2000).astype(np.int16)
    for n in batches:
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
    held = [n for n in batches if report["levels"][str(n)]["real_time"]]
    report["most_sessions_in_real_time"] = max(held) if held else 0
    print(f"most sessions within the {FRAME_MS:g} ms frame: {report['most_sessions_in_real_time']}")
    if device.type == "cuda":
        report["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
