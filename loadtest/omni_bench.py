"""Benchmark: Qwen3-Omni through Parley's stage graph, and the plain transformers baseline.

The full-size Qwen3-Omni-30B-A3B architecture with random bf16 weights (no weights can be
downloaded here), one fixed input (seconds of 16 kHz audio, a few camera frames and a typed
question) and fixed output lengths (random weights never stop by themselves). Phases, each
in its own process so that one's GPU memory is free for the next:

- `parley`: the graph (pipeline/configs/qwen3_omni.yaml's stages, each in a worker process)
  is started once, warmed up, then answers each `--concurrency` level in turn (`--reps`
  rounds of that many requests at once), streamed: time to the first audio chunk and to the
  first text, the real-time factor (wall time / audio produced), Thinker tokens/s and Talker
  frames/s (per request and aggregate), the time between audio chunks, peak GPU memory.
- `kv_reuse`: the Thinker engine alone: a follow-up turn's prefill with and without KV reuse
  (loadtest/omni_bench_engines.py).
- `code2wav`: the Code2Wav engine alone: its time per chunk, batched as in the graph.
- `baseline`: transformers' `Qwen3OmniMoeForConditionalGeneration.generate` on the same
  input ids, audio features and image patches, at batch 1 (it does not stream: its first
  audio is its whole answer).

    python -m loadtest.omni_bench --out bench.json                       # on the GPU
    python -m loadtest.omni_bench --tiny --device cpu --dtype float32    # the plumbing, here
    python -m loadtest.omni_bench --merge a.json b.json --out all.json   # phases run apart
    python -m loadtest.omni_bench --layouts one,split,replicas --concurrency 1,4,10,32,64
        # two GPUs: the parley phase once per layout (omni_bench_options.LAYOUTS), in one run

prints one table and writes everything, with the header that makes it reproducible, as JSON.
`--time-limit-s` bounds the whole command: a phase starts no round it cannot finish in time
(judged by the last round), and one still running at the limit is stopped; every phase
writes what it has after each level, so a stopped phase still reports its finished levels.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import platform
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .omni_bench_engines import code2wav_phase, kv_reuse_phase
from .omni_bench_gpu import GpuMemoryPoller
from .omni_bench_options import PHASES, parser
from .omni_bench_report import (
    FRAME_RATE_HZ,
    level_figures,
    merge,
    percentiles,
    request_record,
    table_lines,
)
from .run_stamp import command_output, source_stamp

OUTPUT_RATE = 24_000
QUESTION = "What is going on in this video, and what did I just say?"
STOP_GRACE_S = 60.0
"""How long a phase stopped at the time limit gets to close its stages."""
HANG_S = 60.0
"""Each stage's hang bound: a GPU step that meets a new shape may take seconds (kernel
choices, lazy set-up), which is no hang."""
CLOSE_RESERVE_S = 20.0
"""A phase starts no round that would end later than this before the time limit."""


def header(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        **source_stamp(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "architecture": "tiny" if args.tiny else "Qwen3-Omni-30B-A3B (random weights)",
        "model_path": args.model_path,
        "graph": graph_yaml(args),
        "input": {
            "audio_s": args.audio_s,
            "frames": args.frames,
            "frame_size": [224, 224],
            "question": QUESTION,
        },
        "lengths": {
            "thinker_tokens": args.think_tokens,
            "speech_s": args.speech_s,
            "talker_frames": frames_for_speech(args.speech_s),
            "code2wav_chunks": [args.first_chunk, args.chunk, args.left_context],
        },
        "warmup_requests": args.warmup,
        "decode": {
            "rows": args.decode_rows,
            "max_context": args.max_context,
            "compile_predictor": args.compile_predictor,
        },
        "prefill": {
            "batch": args.prefill_batch,
            "chunk_tokens": args.prefill_chunk_tokens,
            "talker_batch": args.talker_prefill_batch,
        },
        "placement": args.placement,
        "gpu_sharing": args.gpu_sharing,
        "audio_priority": args.audio_priority,
        "switch_interval_ms": args.switch_interval_ms,
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
    if args.device.startswith("cuda"):
        info["gpu"] = command_output(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        )
    return info


def frames_for_speech(speech_s: float) -> int:
    return round(speech_s * FRAME_RATE_HZ)


def make_request(
    index: int, args: argparse.Namespace, *, history: tuple[Any, ...] = (), **session: Any
) -> Any:
    """The fixed input: seeded noise as audio and as camera frames, and the question."""
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
        request_id=f"resp_bench_{index}",
        audio=audio,
        text=QUESTION,
        frames=tuple(frames),
        history=history,
        **session,  # session_id and item_ids, where requests have them
    )


def out_of_time(args: argparse.Namespace, needed_s: float = 0.0) -> bool:
    """Whether a round of about `needed_s` would end past the command's time limit, less
    the time kept to close the phase (its stages, its file)."""
    deadline: float | None = args.deadline_epoch
    return deadline is not None and time.time() + needed_s > deadline - CLOSE_RESERVE_S


# --- Parley's graph ------------------------------------------------------------------------


def rounds_at(args: argparse.Namespace, concurrency: int) -> int:
    """`--reps` rounds, or more where `--min-requests` asks for more requests at a level."""
    return max(int(args.reps), -(-int(args.min_requests) // concurrency))


def graph_yaml(args: argparse.Namespace) -> str:
    """The bench's graph: each stage in a worker process (`worker`), all in the bench's own
    process (`main`), or all in one worker process as a `subgraph` (what a server would run
    to have the stages share one GPU's time without a process boundary between them)."""
    model = f"dtype: {args.dtype}, tiny: {str(args.tiny).lower()}"
    if args.model_path:
        model += f", model_path: '{args.model_path}'"
    frames = frames_for_speech(args.speech_s)
    think = args.think_tokens
    batch = args.max_batch or max(args.concurrency)
    prefill_batch = args.prefill_batch or batch
    rows = f"decode_rows: {args.decode_rows}, max_context: {args.max_context}"
    inner = "main" if args.placement == "subgraph" else args.placement
    thinker_on, audio_on = (json.dumps(on) for on in layout_devices(args, args.layout))
    stages = f"""\
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {{{model}, max_new_tokens: {think}, min_new_tokens: {think}, max_batch: {batch},
                  prefix_cache_tokens: 65536, {rows}, prefill_batch: {prefill_batch},
                  prefill_chunk_tokens: {args.prefill_chunk_tokens}}}
    placement: {{process: {inner}, devices: {thinker_on}}}
    hang_s: {HANG_S:g}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {{{model}, max_frames: {frames}, min_frames: {frames}, max_batch: {batch},
                  {rows}, stream_priority: {args.audio_priority},
                  compile_predictor: {str(args.compile_predictor).lower()},
                  prefill_batch: {args.talker_prefill_batch}}}
    placement: {{process: {inner}, devices: {audio_on}}}
    hang_s: {HANG_S:g}
  - name: code2wav
    engine: qwen3_omni.code2wav
    engine_args: {{{model}, first_chunk: {args.first_chunk}, chunk: {args.chunk},
                  left_context: {args.left_context}, max_batch: {batch},
                  stream_priority: {args.audio_priority}}}
    placement: {{process: {inner}, devices: {audio_on}}}
    hang_s: {HANG_S:g}
"""
    wiring = """\
edges:
  - {from: thinker, to: talker}
  - {from: talker, to: code2wav}
outputs: [thinker, code2wav]
"""
    if args.placement != "subgraph":
        sharing = f"gpu_sharing: {args.gpu_sharing}\n"
        return f"name: omni_bench\n{sharing}stages:\n{stages}{wiring}"
    nested = textwrap.indent(f"stages:\n{stages}{wiring}", " " * 6)
    switch = ""
    if args.switch_interval_ms is not None:
        switch = f"      switch_interval_ms: {args.switch_interval_ms:g}\n"
    return f"""\
name: omni_bench
stages:
  - name: omni
    engine: subgraph
    engine_args:
{nested}{switch}    placement: {{process: worker}}
    hang_s: {HANG_S:g}
outputs: [omni]
"""


def layout_devices(args: argparse.Namespace, layout: str) -> tuple[list[str], list[str]]:
    """The Thinker's devices and the Talker's and Code2Wav's in `layout` (LAYOUTS in
    omni_bench_options.py)."""
    first, second = args.device, args.second_device
    if layout == "split":
        return [first], [second]
    if layout == "replicas":
        return [first, second], [second]
    return [first], [first]


def phase_devices(args: argparse.Namespace, layout: str) -> list[str]:
    """Every device a phase in `layout` runs on, each once."""
    thinker, audio = layout_devices(args, layout)
    return list(dict.fromkeys([*thinker, *audio]))


def phase_name(phase: str, layout: str) -> str:
    """The report's key for a phase: the parley phase's gets its layout, except `one`."""
    return f"{phase}_{layout}" if phase == "parley" and layout != "one" else phase


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

    path = Path(tempfile.mkdtemp(prefix="omni-bench-")) / "omni_bench.yaml"
    path.write_text(graph_yaml(args))
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
        result["peak_gpu_used_gib"] = memory.peak()
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
    runs: list[dict[str, Any]] = []
    for index in range(args.baseline_reps):
        if runs and out_of_time(args, runs[-1]["total_s"]):
            break
        runs.append(once(index))
    result["c1"] = {
        "requests": len(runs),
        "prompt_tokens": runs[0]["prompt_tokens"],
        "first_audio_ms": percentiles([1000 * r["total_s"] for r in runs]),
        "rtf": percentiles([r["total_s"] / r["audio_s"] for r in runs if r["audio_s"]]),
        "audio_s": percentiles([r["audio_s"] for r in runs]),
    }
    if args.device.startswith("cuda"):
        result["peak_torch_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(f"baseline c1: {json.dumps(result['c1'])}", flush=True)
    return result


# --- the driver ----------------------------------------------------------------------------


def run_phase_in_child(
    phase: str, argv: list[str], args: argparse.Namespace, layout: str = "one"
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
    report: dict[str, Any] = {"header": header(args)}
    runs = [
        (phase, layout)
        for phase in phases
        for layout in (args.layouts if phase == "parley" else ["one"])
    ]
    for phase, layout in runs:
        name = phase_name(phase, layout)
        started = time.perf_counter()
        if out_of_time(args):
            report[name] = {"error": "not started: time limit"}
            continue
        report[name] = run_phase_in_child(phase, [*child_argv, "--layout", layout], args, layout)
        report[name]["phase_s"] = time.perf_counter() - started
        if layout != "one":
            report[name]["graph"] = graph_yaml(
                argparse.Namespace(**{**vars(args), "layout": layout})
            )
        Path(args.out).write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"\nfull report: {args.out}")


if __name__ == "__main__":
    main()
