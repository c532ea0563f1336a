"""The omni bench's `baseline` phase: transformers' `Qwen3OmniMoeForConditionalGeneration.
generate` on the bench's input, at batch 1, with the lengths and the model of the graph file.

`generate` does not stream: it returns the whole answer's text and waveform at once. So its
figure is the time to its finished answer, never a first audio; beside it the table puts
Parley's own finished answer (its `total_s`) at concurrency 1, the figure that compares.
It runs the same model as the graph's Thinker (its `tiny`, `model_path`, `dtype` and device),
the same Thinker reply (its `max_new_tokens` / `min_new_tokens`) and the same speech (the
Talker's `max_frames` / `min_frames`), overrides included.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .omni_bench_input import make_request, out_of_time
from .omni_bench_report import percentiles
from .omni_graph import engine_setting, flat_graph

OUTPUT_RATE = 24_000
STAGES = ("thinker", "talker")
"""The stages whose settings the baseline takes (and whose overrides its figure carries)."""


def baseline_phase(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from pipeline.engines.qwen3_omni.audio_features import AudioFeatures
    from pipeline.engines.qwen3_omni.prompt import chat_prompt, load_vocab
    from pipeline.engines.qwen3_omni.thinker import DEFAULT_INSTRUCTIONS
    from pipeline.engines.qwen3_omni.vision_input import TOKEN_PIXELS, FrameImages
    from pipeline.engines.qwen3_omni.weights import _fix_uninitialised, load_config

    graph = flat_graph(args)
    model_args = graph.engine_kwargs("thinker")
    device = str(model_args.get("device", "cpu"))
    model_path = model_args.get("model_path")
    dtype = getattr(torch, str(model_args.get("dtype", "float32")))
    think = int(engine_setting(graph, "thinker", "max_new_tokens", 128))
    think_min = int(engine_setting(graph, "thinker", "min_new_tokens", 0))
    frames = int(engine_setting(graph, "talker", "max_frames", 375))
    frames_min = int(engine_setting(graph, "talker", "min_frames", 0))
    config = load_config(model_path, bool(model_args.get("tiny", False)))
    built = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3OmniMoeForConditionalGeneration._from_config(config, dtype=dtype)
    _fix_uninitialised(model, 0)
    model.eval()
    result: dict[str, Any] = {
        "build_s": time.perf_counter() - built,
        "what": "transformers generate(), batch 1: time to its finished answer (no streaming)",
        "lengths": {"thinker_tokens": [think_min, think], "talker_frames": [frames_min, frames]},
    }
    vision = config.thinker_config.vision_config
    images = FrameImages(
        patch_size=int(vision.patch_size),
        merge_size=int(vision.spatial_merge_size),
        temporal_patch_size=int(vision.temporal_patch_size),
        max_pixels=128 * TOKEN_PIXELS,
    )
    features = AudioFeatures(int(config.thinker_config.audio_config.num_mel_bins), model_path)
    vocab = load_vocab(model_path)

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
        inputs: dict[str, Any] = {"input_ids": torch.tensor([ids], device=device)}
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        if audio is not None:
            inputs["input_features"] = audio.features.to(device, dtype)
            inputs["feature_attention_mask"] = audio.mask.to(device)
        if seen is not None:
            inputs["pixel_values"] = seen.pixel_values.to(device, dtype)
            inputs["image_grid_thw"] = seen.grid_thw.to(device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.inference_mode():
            _, wav = model.generate(
                **inputs,
                speaker="Ethan",
                thinker_max_new_tokens=think,
                thinker_min_new_tokens=think_min,
                thinker_do_sample=False,
                talker_max_new_tokens=frames + 1,
                talker_min_new_tokens=frames_min + 1 if frames_min else 0,
            )
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        took = time.perf_counter() - started
        samples = int(wav[0].shape[-1] if isinstance(wav, list) else wav.shape[-1])
        return {"prompt_tokens": len(ids), "total_s": took, "audio_s": samples / OUTPUT_RATE}

    for index in range(args.warmup):
        once(10_000 + index)
    runs: list[dict[str, Any]] = []
    for index in range(args.baseline_reps):
        if runs and out_of_time(args, runs[-1]["total_s"]):
            break
        runs.append(once(index))
    result["c1"] = {
        "requests": len(runs),
        "prompt_tokens": runs[0]["prompt_tokens"] if runs else None,
        "finished_answer_ms": percentiles([1000 * r["total_s"] for r in runs]),
        "rtf": percentiles([r["total_s"] / r["audio_s"] for r in runs if r["audio_s"]]),
        "audio_s": percentiles([r["audio_s"] for r in runs]),
    }
    if device.startswith("cuda"):
        result["peak_torch_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(f"baseline c1: {json.dumps(result['c1'])}", flush=True)
    return result
