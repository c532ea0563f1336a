"""The Thinker on a real vLLM beside the embedded one, in the same run.

Starts `vllm serve` (vLLM's CPU build, `make vllm-env`, serving the cascade's SmolLM2
checkpoint: loadtest/vllm_server.py), then measures, in this order:

1. the Thinker's time to first token on one session, turn after turn (a fresh session's
   first turn against the same session's turn N, whose request begins as the last one did:
   the server's prefix cache), with the prompt tokens each turn sent;
2. a cancel (a barge-in closes the stream) against vLLM's own metrics: how soon after the
   stream closed `/metrics` said it was generating nothing, polled back to back from a
   thread over a kept-alive connection (an upper bound: the end of the first poll that
   saw 0; a lower bound: the start of the last poll, begun after the cancel, that still
   saw the request running);
3. `loadtest.voice_bench` (spoken questions over the Realtime WebSocket, server VAD) on the
   embedded `cascade` and on the `vllm` graph pointed at this server: first audio after the
   end of speech, p50 / p95, and the ratio.

    python -m loadtest.vllm_bench --n 5 --turns 5 --cancels 20 \
        --json loadtest/results/vllm_bench_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from pipeline.engines.openai_chat.thinker import ChatThinkerEngine
from pipeline.registry import CONFIGS
from pipeline.types import HistoryItem, PipelineRequest, TextDelta

from .vllm_server import LONG_ANSWER, MODEL, Vllm, start, stop

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


class MetricsPoller:
    """vLLM's running requests, polled back to back in a thread: (began, ended, running)."""

    def __init__(self, server: Vllm) -> None:
        self.url = f"http://127.0.0.1:{server.port}/metrics"
        self.polls: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-metrics", daemon=True)

    def __enter__(self) -> MetricsPoller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                text = client.get(self.url).text
                running = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_running "))
                )
                self.polls.append((began, time.monotonic(), running))

    def stopped_within(self, cancelled: float) -> tuple[float, float] | None:
        """(lower, upper) bounds in ms on when the server stopped after `cancelled`."""
        after = [p for p in self.polls if p[0] >= cancelled]
        zero = next((p for p in after if p[2] == 0), None)
        if zero is None:
            return None
        still = [p for p in after if p[2] > 0 and p[0] < zero[0]]
        lower = (still[-1][0] - cancelled) * 1000 if still else 0.0
        return lower, (zero[1] - cancelled) * 1000


async def cancels(server: Vllm, n: int) -> dict[str, Any]:
    """`n` long answers, each cancelled after its first words: how soon vLLM stopped."""
    engine = ChatThinkerEngine(
        url=server.url, model=MODEL, recognizer="none", max_tokens=256,
        sampling={"temperature": 0.0},
    )  # fmt: skip
    await engine.start()
    bounds: list[tuple[float, float]] = []
    try:
        with MetricsPoller(server) as poller:
            for k in range(n):
                request = PipelineRequest(f"c{k}", np.zeros(0, np.int16), text=LONG_ANSWER)
                stream = engine.generate(f"c{k}", request)
                words = 0
                async for chunk in stream:
                    if isinstance(chunk, TextDelta) and chunk.text.strip():
                        words += 1
                        if words == 5:
                            break
                else:  # it stopped by itself: nothing to time
                    raise RuntimeError(f"the answer ended after {words} words, before a cancel")
                cancelled = time.monotonic()
                await stream.aclose()
                deadline = time.monotonic() + 5
                while (found := poller.stopped_within(cancelled)) is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError("vLLM was still generating 5 s after a cancel")
                    await asyncio.sleep(0.02)
                bounds.append(found)
                await asyncio.sleep(0.3)
            polls = [1000 * (end - began) for began, end, _ in poller.polls]
    finally:
        await engine.close()
    upper = sorted(b[1] for b in bounds)
    return {
        "n": n,
        "stopped_by_ms": {
            "p50": round(statistics.median(upper)),
            "p95": round(upper[min(len(upper) - 1, int(0.95 * len(upper)))]),
            "max": round(upper[-1]),
        },
        "still_running_at_ms_max": round(max(b[0] for b in bounds)),
        "poll_ms_p50": round(statistics.median(polls), 1),
    }


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
    parser.add_argument("--n", type=int, default=5, help="spoken questions per pipeline (0: none)")
    parser.add_argument("--turns", type=int, default=5, help="turns of the first-token session")
    parser.add_argument("--cancels", type=int, default=20, help="answers cancelled")
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
            if args.cancels:
                report["cancel"] = asyncio.run(cancels(server, args.cancels))
            if args.n:
                embedded = voice("cascade", args.n, workdir / "cascade.json")
                served = voice(graph_for(server, workdir), args.n, workdir / "vllm.json")
                report["first_audio"] = {
                    "cascade": first_audio(embedded),
                    "vllm": first_audio(served),
                }
        finally:
            stop(server)
    if "first_audio" in report:
        cascade, vllm = report["first_audio"]["cascade"], report["first_audio"]["vllm"]
        if cascade["p50_ms"] and vllm["p50_ms"]:
            report["vllm_over_cascade_p50"] = round(vllm["p50_ms"] / cascade["p50_ms"], 2)
    print(f"vllm serve up in {report['vllm_start_s']} s")
    for turn in report["first_tokens"]:
        print(
            f"  turn {turn['turn']}: first token {turn['first_token_ms']} ms, "
            f"prompt {turn['prompt_tokens']} tokens (cached {turn['cached_tokens']})"
        )
    if "cancel" in report:
        cancel = report["cancel"]
        stopped = cancel["stopped_by_ms"]
        print(
            f"  cancel -> vLLM running 0 (n={cancel['n']}): by p50 {stopped['p50']} / "
            f"p95 {stopped['p95']} / max {stopped['max']} ms; seen running at most "
            f"{cancel['still_running_at_ms_max']} ms after; one poll {cancel['poll_ms_p50']} ms"
        )
    for name, row in report.get("first_audio", {}).items():
        print(f"  {name:8} first audio after speech: p50 {row['p50_ms']} / p95 {row['p95_ms']} ms")
    if "vllm_over_cascade_p50" in report:
        print(f"  vllm / cascade, p50: {report['vllm_over_cascade_p50']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
