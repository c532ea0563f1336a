"""The Thinker on a real vLLM beside the embedded one, in the same run.

Starts `vllm serve` (vLLM's CPU build, `make vllm-env`, serving the cascade's SmolLM2
checkpoint: loadtest/vllm_server.py), then measures, in this order:

1. the Thinker's time to first token on one session, turn after turn (a fresh session's
   first turn against the same session's turn N, whose request begins as the last one did:
   the server's prefix cache), with the prompt tokens each turn sent;
2. `loadtest.voice_bench` (spoken questions over the Realtime WebSocket, server VAD) on the
   embedded `cascade` and on the `vllm` graph pointed at this server: first audio after the
   end of speech, p50 / p95, and the ratio.

    python -m loadtest.vllm_bench --n 5 --turns 5 --json loadtest/results/vllm_bench_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pipeline.engines.openai_chat.thinker import ChatThinkerEngine
from pipeline.registry import CONFIGS
from pipeline.types import HistoryItem, PipelineRequest, TextDelta

from .vllm_server import MODEL, Vllm, start, stop

QUESTIONS = (
    "What is the capital of France?",
    "And how many people live there?",
    "What is it famous for?",
    "Name one museum there.",
    "What is the weather usually like in spring?",
    "Which river runs through it?",
    "How do people get around?",
    "What food should I try?",
)


async def first_tokens(server: Vllm, turns: int) -> list[dict[str, Any]]:
    """One session's turns: time to the first word, and the prompt each sent."""
    engine = ChatThinkerEngine(
        url=server.url, model=MODEL, recognizer="none", max_tokens=32, sampling={"temperature": 0.0}
    )
    await engine.start()
    history: list[HistoryItem] = []
    out: list[dict[str, Any]] = []
    try:
        for k in range(turns):
            question = QUESTIONS[k % len(QUESTIONS)]
            request = PipelineRequest(
                f"r{k}", np.zeros(0, np.int16), text=question, history=tuple(history)
            )
            began = time.monotonic()
            first: float | None = None
            words = ""
            async for chunk in engine.generate(f"r{k}", request):
                if isinstance(chunk, TextDelta) and chunk.kind == "output":
                    if first is None and chunk.text.strip():
                        first = time.monotonic()
                    words += chunk.text
            usage = engine.last_usage or {}
            out.append(
                {
                    "turn": k + 1,
                    "first_token_ms": None if first is None else round((first - began) * 1000),
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens"
                    ),
                }
            )
            history += [HistoryItem("user", question), HistoryItem("assistant", words.strip())]
    finally:
        await engine.close()
    return out


def voice(pipeline: str, n: int, into: Path) -> dict[str, Any]:
    """`loadtest.voice_bench` on `pipeline`, in a process of its own."""
    command = [sys.executable, "-m", "loadtest.voice_bench", "--n", str(n)]
    command += ["--pipeline", pipeline, "--json", str(into)]
    subprocess.run(command, check=True, timeout=1800)
    results: dict[str, Any] = json.loads(into.read_text())
    return results


def graph_for(server: Vllm, directory: Path) -> str:
    config = yaml.safe_load((CONFIGS / "vllm.yaml").read_text())
    config["stages"][0]["engine_args"].update(url=server.url, model=MODEL)
    path = directory / "vllm_bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def first_audio(results: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = results["speech_stopped->first_audio"]
    return {"p50_ms": row["p50_ms"], "p95_ms": row["p95_ms"], "n": row["n"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--n", type=int, default=5, help="spoken questions per pipeline")
    parser.add_argument("--turns", type=int, default=5, help="turns of the first-token session")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"date": time.ctime()}
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp:
        workdir = Path(tmp)
        began = time.monotonic()
        server = start(workdir)
        report["vllm_start_s"] = round(time.monotonic() - began, 1)
        try:
            report["first_tokens"] = asyncio.run(first_tokens(server, args.turns))
            embedded = voice("cascade", args.n, workdir / "cascade.json")
            served = voice(graph_for(server, workdir), args.n, workdir / "vllm.json")
        finally:
            stop(server)
    report["first_audio"] = {"cascade": first_audio(embedded), "vllm": first_audio(served)}
    cascade, vllm = report["first_audio"]["cascade"], report["first_audio"]["vllm"]
    if cascade["p50_ms"] and vllm["p50_ms"]:
        report["vllm_over_cascade_p50"] = round(vllm["p50_ms"] / cascade["p50_ms"], 2)
    print(f"vllm serve up in {report['vllm_start_s']} s")
    for turn in report["first_tokens"]:
        print(
            f"  turn {turn['turn']}: first token {turn['first_token_ms']} ms, "
            f"prompt {turn['prompt_tokens']} tokens (cached {turn['cached_tokens']})"
        )
    for name, row in report["first_audio"].items():
        print(f"  {name:8} first audio after speech: p50 {row['p50_ms']} / p95 {row['p95_ms']} ms")
    if "vllm_over_cascade_p50" in report:
        print(f"  vllm / cascade, p50: {report['vllm_over_cascade_p50']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
