"""Where a Thinker prefill's time goes, alone and batched: media towers, decoder layers, the rest.

The bench's prompt (`omni_bench.make_request`: seconds of audio, camera frames, a question)
is prefilled by the Thinker alone (`ThinkerRunner.prefill_job`) at each batch size, and each
part timed with the device synchronised: `begin` (per row: log-mel and image patches are
made beforehand; the audio and vision towers and the merge), the decoder layers (`run_chunk`,
all rows at once), and `finish` (each row's cache cut out, hidden states to the host, the
first token chosen).

    python -m loadtest.omni_prefill --batches 1,4,10 --out prefill.json        # on the GPU
    python -m loadtest.omni_prefill --tiny --device cpu --dtype float32 --batches 1,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.weights import build_part

from .omni_bench_input import make_request


def _timed(device: torch.device, work: Callable[[], Any]) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    work()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - began) * 1000


def measure(args: argparse.Namespace) -> dict[str, Any]:
    engine = ThinkerEngine(
        tiny=args.tiny, device=args.device, dtype=args.dtype, warm_up=False, max_new_tokens=8
    )
    engine.model, engine.config = build_part(
        "thinker", model_path=None, tiny=args.tiny, seed=0, dtype=engine.dtype, device=args.device
    )
    engine._loaded()  # the runner, made here: this thread is the model thread
    runner = engine.runner
    assert runner is not None
    device = torch.device(args.device)
    prompt = engine._fitted_prompt(make_request(0, args), None).prompt
    report: dict[str, Any] = {"prompt_positions": len(prompt.input_ids), "batches": {}}
    for batch in args.batches:
        rows: dict[str, list[float]] = {"towers": [], "layers": [], "finish": [], "total": []}
        for repeat in range(args.repeats + 1):
            job = runner.prefill_job([(prompt, None)] * batch)
            towers = _timed(device, job.batch.begin)
            layers = 0.0
            while not job.batch.done:
                layers += _timed(device, job.batch.run_chunk)
            finish = _timed(device, lambda job=job: runner.finish_prefill(job))  # type: ignore[misc]
            if repeat == 0:
                continue  # the first at a size pays for first use
            rows["towers"].append(towers)
            rows["layers"].append(layers)
            rows["finish"].append(finish)
            rows["total"].append(towers + layers + finish)
        figures = {part: statistics.median(values) for part, values in rows.items()}
        report["batches"][str(batch)] = figures
        print(f"batch {batch}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in figures.items()))
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--audio-s", type=float, default=10.0, help="the bench's question audio")
    p.add_argument("--frames", type=int, default=4, help="camera frames with it")
    p.add_argument("--out", default="omni_prefill.json")
    p.add_argument("--batches", default="1,4,10", help="batch sizes, e.g. 1,4,10")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    args.batches = [int(b) for b in str(args.batches).split(",")]
    report = measure(args)
    with open(args.out, "w") as out:
        json.dump({"argv": vars(args), "torch": torch.__version__, **report}, out, indent=1)


if __name__ == "__main__":
    main()
