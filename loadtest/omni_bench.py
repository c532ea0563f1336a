"""Benchmark: Qwen3-Omni through Parley's stage graph, and the plain transformers baseline.

The full-size Qwen3-Omni-30B-A3B architecture with random bf16 weights (no weights can be
downloaded here), one fixed input (seconds of 16 kHz audio, a few camera frames and a typed
question) and fixed output lengths (random weights never stop by themselves). Two phases,
each in its own process so that one's GPU memory is free for the other:

- `parley`: the graph (pipeline/configs/qwen3_omni.yaml's stages, each in a worker process)
  answers `--concurrency` requests at once, streamed: time to the first audio chunk, the
  real-time factor (wall time / audio produced), Thinker tokens/s, Talker frames/s and the
  time between audio chunks, with full percentiles.
- `baseline`: transformers' `Qwen3OmniMoeForConditionalGeneration.generate` on the same
  input ids, audio features and image patches, at batch 1 (it does not stream: its first
  audio is its whole answer).

    python -m loadtest.omni_bench --out bench.json                       # on the GPU
    python -m loadtest.omni_bench --tiny --device cpu --dtype float32    # the plumbing, here

prints one table and writes everything, with the header that makes it reproducible, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

FRAME_RATE_HZ = 12.5
"""Codec frames per second of speech."""
OUTPUT_RATE = 24_000
QUESTION = "What is going on in this video, and what did I just say?"


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values, dtype=np.float64)
    out = {f"p{q}": float(np.percentile(a, q)) for q in (50, 90, 95, 99)}
    out.update(min=float(a.min()), max=float(a.max()), mean=float(a.mean()), n=float(len(a)))
    return out


def header(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    def run(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            return repr(exc)

    info: dict[str, Any] = {
        "commit": run(["git", "rev-parse", "HEAD"]) or os.environ.get("PARLEY_COMMIT", ""),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "architecture": "tiny" if args.tiny else "Qwen3-Omni-30B-A3B (random weights)",
        "input": {
            "audio_s": args.audio_s,
            "frames": args.frames,
            "question": QUESTION,
        },
        "lengths": {"thinker_tokens": args.think_tokens, "speech_s": args.speech_s},
        "warmup_requests": args.warmup,
        "concurrency": args.concurrency,
        "argv": sys.argv,
    }
    if args.device.startswith("cuda"):
        info["gpu"] = run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        )
    return info


def frames_for_speech(speech_s: float) -> int:
    return round(speech_s * FRAME_RATE_HZ)


def make_request(index: int, args: argparse.Namespace) -> Any:
    from PIL import Image

    from pipeline.types import PipelineRequest, VideoFrame

    rng = np.random.default_rng(index)
    audio = (rng.standard_normal(int(args.audio_s * 16_000)) * 2000).astype(np.int16)
    frames = []
    for k in range(args.frames):
        buffer = io.BytesIO()
        pixels = rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, "JPEG")
        frames.append(VideoFrame(buffer.getvalue(), timestamp_ms=k * 500))
    return PipelineRequest(
        request_id=f"resp_bench_{index}", audio=audio, text=QUESTION, frames=tuple(frames)
    )


# --- Parley's graph ------------------------------------------------------------------------


def graph_file(args: argparse.Namespace) -> str:
    model = f"device: '{args.device}', dtype: {args.dtype}, tiny: {str(args.tiny).lower()}"
    if args.model_path:
        model += f", model_path: '{args.model_path}'"
    frames = frames_for_speech(args.speech_s)
    think = args.think_tokens
    body = f"""\
name: omni_bench
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {{{model}, max_new_tokens: {think}, min_new_tokens: {think}}}
    placement: {{process: worker}}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {{{model}, max_frames: {frames}, min_frames: {frames}}}
    placement: {{process: worker}}
  - name: code2wav
    engine: qwen3_omni.code2wav
    engine_args: {{{model}, first_chunk: {args.first_chunk}, chunk: 25, left_context: 25}}
    placement: {{process: worker}}
edges:
  - {{from: thinker, to: talker}}
  - {{from: talker, to: code2wav}}
outputs: [thinker, code2wav]
"""
    path = Path(tempfile.mkdtemp(prefix="omni-bench-")) / "omni_bench.yaml"
    path.write_text(body)
    return str(path)


async def one_request(graph: Any, request: Any) -> dict[str, Any]:
    from pipeline.types import AudioChunk, End, ErrorChunk, TextDelta

    started = time.perf_counter()
    text_times: list[float] = []
    audio_times: list[float] = []
    audio_ms = 0.0
    error = None
    async for chunk in graph.generate(request):
        now = time.perf_counter() - started
        if isinstance(chunk, TextDelta) and chunk.kind == "output":
            text_times.append(now)
        elif isinstance(chunk, AudioChunk):
            audio_times.append(now)
            audio_ms += chunk.duration_ms
        elif isinstance(chunk, ErrorChunk):
            error = chunk.message
        elif isinstance(chunk, End):
            break
    total = time.perf_counter() - started
    gaps = [b - a for a, b in zip(audio_times, audio_times[1:], strict=False)]
    thinking = (text_times[-1] - text_times[0]) if len(text_times) > 1 else 0.0
    speaking = (audio_times[-1] - audio_times[0]) if len(audio_times) > 1 else 0.0
    return {
        "error": error,
        "first_text_s": text_times[0] if text_times else None,
        "first_audio_s": audio_times[0] if audio_times else None,
        "total_s": total,
        "audio_s": audio_ms / 1000,
        "rtf": total / (audio_ms / 1000) if audio_ms else None,
        "thinker_tokens_per_s": (len(text_times) - 1) / thinking if thinking else None,
        "audio_s_per_s_after_first": (audio_ms / 1000 - 0) / speaking if speaking else None,
        "audio_chunk_gap_s": gaps,
    }


async def parley_phase(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.graph import StageGraph
    from pipeline.registry import load_pipeline

    result: dict[str, Any] = {}
    built = time.perf_counter()
    graph = load_pipeline(graph_file(args))
    assert isinstance(graph, StageGraph)
    await graph.start()
    result["start_s"] = time.perf_counter() - built
    try:
        for index in range(args.warmup):
            warm = await one_request(graph, make_request(10_000 + index, args))
            if warm["error"]:
                raise RuntimeError(f"warm-up failed: {warm['error']}")
        for concurrency in args.concurrency:
            runs: list[dict[str, Any]] = []
            for rep in range(args.reps):
                requests = [make_request(1000 * rep + i, args) for i in range(concurrency)]
                runs += await asyncio.gather(*(one_request(graph, r) for r in requests))
            errors = [r["error"] for r in runs if r["error"]]
            result[f"c{concurrency}"] = {
                "requests": len(runs),
                "errors": errors[:3],
                "first_audio_ms": percentiles(
                    [1000 * r["first_audio_s"] for r in runs if r["first_audio_s"] is not None]
                ),
                "first_text_ms": percentiles(
                    [1000 * r["first_text_s"] for r in runs if r["first_text_s"] is not None]
                ),
                "rtf": percentiles([r["rtf"] for r in runs if r["rtf"]]),
                "thinker_tokens_per_s": percentiles(
                    [r["thinker_tokens_per_s"] for r in runs if r["thinker_tokens_per_s"]]
                ),
                "talker_frames_per_s": percentiles(
                    [
                        FRAME_RATE_HZ * r["audio_s_per_s_after_first"]
                        for r in runs
                        if r["audio_s_per_s_after_first"]
                    ]
                ),
                "audio_chunk_gap_ms": percentiles(
                    [1000 * g for r in runs for g in r["audio_chunk_gap_s"]]
                ),
                "audio_s": percentiles([r["audio_s"] for r in runs]),
            }
            print(f"parley c{concurrency}: {json.dumps(result[f'c{concurrency}'])}", flush=True)
    finally:
        await graph.close()
    return result


# --- the transformers baseline -------------------------------------------------------------


def baseline_phase(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from pipeline.engines.qwen3_omni.audio_features import AudioFeatures
    from pipeline.engines.qwen3_omni.prompt import chat_prompt, load_vocab
    from pipeline.engines.qwen3_omni.thinker import DEFAULT_INSTRUCTIONS
    from pipeline.engines.qwen3_omni.vision_input import TOKEN_PIXELS, FrameImages
    from pipeline.engines.qwen3_omni.weights import _fix_uninitialised, load_config

    dtype = getattr(torch, args.dtype)
    config = load_config(args.model_path, args.tiny)
    built = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen3OmniMoeForConditionalGeneration._from_config(config, dtype=dtype)
    _fix_uninitialised(model, 0)
    model.eval()
    result: dict[str, Any] = {"build_s": time.perf_counter() - built}
    vision = config.thinker_config.vision_config
    images = FrameImages(
        patch_size=int(vision.patch_size),
        merge_size=int(vision.spatial_merge_size),
        temporal_patch_size=int(vision.temporal_patch_size),
        max_pixels=128 * TOKEN_PIXELS,
    )
    features = AudioFeatures(int(config.thinker_config.audio_config.num_mel_bins), args.model_path)
    vocab = load_vocab(args.model_path)
    frames = frames_for_speech(args.speech_s)

    def once(index: int) -> dict[str, Any]:
        request = make_request(index, args)
        audio, seen = features(request.audio), images(request.frames)
        ids = chat_prompt(
            vocab,
            instructions=DEFAULT_INSTRUCTIONS,
            history=[],
            audio_tokens=audio.tokens if audio else 0,
            text=request.text,
            image_tokens=seen.tokens if seen else (),
        )
        inputs: dict[str, Any] = {"input_ids": torch.tensor([ids], device=args.device)}
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        if audio is not None:
            inputs["input_features"] = audio.features.to(args.device, dtype)
            inputs["feature_attention_mask"] = audio.mask.to(args.device)
        if seen is not None:
            inputs["pixel_values"] = seen.pixel_values.to(args.device, dtype)
            inputs["image_grid_thw"] = seen.grid_thw.to(args.device)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.inference_mode():
            _, wav = model.generate(
                **inputs,
                speaker="Ethan",
                thinker_max_new_tokens=args.think_tokens,
                thinker_min_new_tokens=args.think_tokens,
                thinker_do_sample=False,
                talker_max_new_tokens=frames + 1,
                talker_min_new_tokens=frames + 1,
            )
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        took = time.perf_counter() - started
        samples = int(wav[0].shape[-1] if isinstance(wav, list) else wav.shape[-1])
        audio_s = samples / OUTPUT_RATE
        return {"prompt_tokens": len(ids), "total_s": took, "audio_s": audio_s}

    for index in range(args.warmup):
        once(10_000 + index)
    runs = [once(i) for i in range(args.baseline_reps)]
    result["c1"] = {
        "requests": len(runs),
        "prompt_tokens": runs[0]["prompt_tokens"],
        "first_audio_ms": percentiles([1000 * r["total_s"] for r in runs]),
        "rtf": percentiles([r["total_s"] / r["audio_s"] for r in runs if r["audio_s"]]),
        "audio_s": percentiles([r["audio_s"] for r in runs]),
    }
    if args.device.startswith("cuda"):
        result["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(f"baseline c1: {json.dumps(result['c1'])}", flush=True)
    return result


# --- the driver ----------------------------------------------------------------------------


def gpu_memory_gib() -> float | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        return float(out.split()[0]) / 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def run_phase_in_child(phase: str, argv: list[str]) -> dict[str, Any]:
    """One phase in a fresh process (its GPU memory is all free again when it exits)."""
    out = Path(tempfile.mkdtemp(prefix="omni-bench-")) / f"{phase}.json"
    command = [sys.executable, "-m", "loadtest.omni_bench", *argv, "--phase", phase]
    command += ["--phase-out", str(out)]
    peak: list[float] = []
    with subprocess.Popen(command) as child:
        while child.poll() is None:
            used = gpu_memory_gib()
            if used is not None:
                peak.append(used)
            time.sleep(1.0)
    if child.returncode != 0 or not out.is_file():
        return {"error": f"phase {phase} exited {child.returncode}"}
    result: dict[str, Any] = json.loads(out.read_text())
    if peak:
        result["peak_gpu_used_gib"] = max(peak)
    return result


def print_table(report: dict[str, Any]) -> None:
    print("\nQwen3-Omni, first audio and real-time factor (p50 / p95)")
    for name in ("parley", "baseline"):
        phase = report.get(name) or {}
        for key, row in phase.items():
            if not key.startswith("c") or not isinstance(row, dict) or "rtf" not in row:
                continue
            fa, rtf = row.get("first_audio_ms", {}), row.get("rtf", {})
            print(
                f"  {name:8} {key:>4}: first audio {fa.get('p50', float('nan')):9.0f} / "
                f"{fa.get('p95', float('nan')):9.0f} ms   RTF {rtf.get('p50', float('nan')):6.3f}"
                f" / {rtf.get('p95', float('nan')):6.3f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--audio-s", type=float, default=10.0)
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--think-tokens", type=int, default=128)
    parser.add_argument("--speech-s", type=float, default=10.0)
    parser.add_argument("--first-chunk", type=int, default=5)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 10]
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--baseline-reps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--phases", default="parley,baseline")
    parser.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="omni_bench.json")
    args = parser.parse_args()
    if args.phase is not None:
        run = parley_phase if args.phase == "parley" else None
        result = asyncio.run(run(args)) if run is not None else baseline_phase(args)
        Path(args.phase_out).write_text(json.dumps(result))
        return
    argv = list(sys.argv[1:])
    report: dict[str, Any] = {"header": header(args)}
    for phase in args.phases.split(","):
        started = time.perf_counter()
        report[phase] = run_phase_in_child(phase, argv)
        report[phase]["phase_s"] = time.perf_counter() - started
        Path(args.out).write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"\nfull report: {args.out}")


if __name__ == "__main__":
    main()
