"""Benchmark: the cascade Thinker (SmolLM2-135M) alone, its speed and its answers.

The twenty questions of the voice benchmark (`loadtest.questions`) go to the real
`ThinkerEngine` as typed turns, with the cascade config's settings (48 new tokens, a 512-token
context), three ways:

- fresh: each question alone, with no KV kept from before (the prefix cache forgotten);
- shared start: each question alone, the instructions' KV kept from the question before, as
  for a new session with the default instructions;
- conversation: the twenty in one conversation, each turn with the history before it, the
  history's KV kept from the turn before (and, to compare, the same prompts prefilled in full).

Per way: time to the first token and to the first clause's words (the Talker's first clause),
and the decode time per token; the key-word hit rate of the fresh way's answers and of the
conversation's.
Then batched: the first `--batch` questions at once, fresh, as one batch of that many rows
(its ms per token is per step of the batch, every row gaining a token per step).

Each thread count and weight format (`--weights fp32,int8`: the Thinker's `weights` engine
argument, `int8_weights.py`) runs in its own process, started as Parley starts its workers
(OpenMP's idle threads sleeping, `pipeline/worker.py`). `--busy` keeps one core busy with
another process the whole time, as other sessions' work would.

    .venv/bin/python -m loadtest.thinker_bench [--threads 1,2] [--weights fp32,int8]
        [--batch 4,8] [--busy] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.engines.cascade.talker import FIRST_CLAUSE_WORDS
from pipeline.worker import stage_environment

from .questions import QUESTIONS, hits


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def _p95(values: list[float]) -> float:
    return round(float(np.percentile(values, 95)), 1)


async def _answer(engine: Any, rid: str, text: str, history: tuple[Any, ...]) -> dict[str, Any]:
    from pipeline.types import PipelineRequest, TextDelta

    request = PipelineRequest(
        request_id=rid, audio=np.zeros(0, dtype=np.int16), text=text, history=history
    )
    started = time.perf_counter()
    first = clause = None
    deltas = 0
    answer = ""
    async for chunk in engine.generate(rid, request):
        if isinstance(chunk, TextDelta) and chunk.kind == "output":
            now = time.perf_counter()
            first = first or now
            answer += chunk.text
            deltas += 1
            if clause is None and len(answer.split()) > FIRST_CLAUSE_WORDS:
                clause = now
    ended = time.perf_counter()
    return {
        "first_token_ms": 1000 * ((first or ended) - started),
        "first_clause_ms": 1000 * ((clause or ended) - started),
        "ms_per_token": 1000 * (ended - (first or ended)) / max(1, deltas - 1),
        "reused": engine.reused_prompt_tokens,
        "answer": answer,
    }


def _summary(turns: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("first_token_ms", "first_clause_ms", "ms_per_token"):
        values = [t[key] for t in turns]
        out[key] = {"p50": _p50(values), "p95": _p95(values)}
    out["reused_tokens_p50"] = statistics.median(t["reused"] for t in turns)
    return out


async def _batched(engine: Any, size: int) -> dict[str, Any]:
    """The first `size` questions at once, as one batch; their answers' key-word hits."""
    engine.forget_prompts()
    asked = QUESTIONS[:size]
    turns = await asyncio.gather(
        *(_answer(engine, f"b{size}-{i}", q.text, ()) for i, q in enumerate(asked))
    )
    hit = sum(hits(t["answer"], q.keywords) for t, q in zip(turns, asked, strict=True))
    return {
        "rows": engine.batch_size,
        "first_token_ms": _p50([t["first_token_ms"] for t in turns]),
        "ms_per_token": _p50([t["ms_per_token"] for t in turns]),
        "keyword_hits": f"{hit}/{size}",
    }


async def _measure(threads: int, weights: str, batches: list[int]) -> dict[str, Any]:
    from pipeline.engines.cascade.thinker import ThinkerEngine
    from pipeline.types import HistoryItem

    engine = ThinkerEngine(max_new_tokens=48, context_tokens=512, threads=threads, weights=weights)
    await engine.start()
    try:
        await _answer(engine, "warm-up", "Hello!", ())
        fresh, shared, kept, full = [], [], [], []
        for i, q in enumerate(QUESTIONS):
            engine.forget_prompts()
            fresh.append(await _answer(engine, f"f{i}", q.text, ()))
            shared.append(await _answer(engine, f"s{i}", q.text, ()))
        history: tuple[HistoryItem, ...] = ()
        for i, q in enumerate(QUESTIONS):
            turn = await _answer(engine, f"c{i}", q.text, history)
            kept.append(turn)
            engine.forget_prompts()
            full.append(await _answer(engine, f"n{i}", q.text, history))
            await _answer(engine, f"r{i}", q.text, history)  # keep this turn's KV again
            history += (HistoryItem("user", q.text), HistoryItem("assistant", turn["answer"]))
        hit = sum(hits(t["answer"], q.keywords) for t, q in zip(fresh, QUESTIONS, strict=True))
        talk = sum(hits(t["answer"], q.keywords) for t, q in zip(kept, QUESTIONS, strict=True))
        batched = {str(size): await _batched(engine, size) for size in batches}
        return {
            "threads": threads,
            "weights": weights,
            "batched": batched,
            "fresh": _summary(fresh),
            "shared_start": _summary(shared),
            "conversation_kept": _summary(kept),
            "conversation_full": _summary(full),
            "keyword_hit_rate": round(hit / len(QUESTIONS), 3),
            "conversation_hit_rate": round(talk / len(QUESTIONS), 3),
            "answers": [t["answer"] for t in fresh],
            "conversation_answers": [t["answer"] for t in kept],
        }
    finally:
        await engine.close()


@contextmanager
def _busy_core(busy: bool) -> Iterator[None]:
    if not busy:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def _run_child(threads: int, weights: str, batches: str) -> dict[str, Any]:
    child = ["--child", str(threads), "--weights", weights, "--batch", batches]
    done = subprocess.run(
        [sys.executable, "-m", "loadtest.thinker_bench", *child],
        env=stage_environment(),
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _table(results: list[dict[str, Any]], busy: bool) -> str:
    lines = [
        f"SmolLM2-135M Thinker, {len(QUESTIONS)} questions" + (", one core busy" if busy else ""),
        f"  {'threads / way':34} {'first token':>14} {'first clause':>14} {'ms/token':>10}",
    ]
    for result in results:
        label = f"{result['threads']} {result['weights']}"
        for way in ("fresh", "shared_start", "conversation_kept", "conversation_full"):
            s = result[way]
            cells = [
                f"{s[k]['p50']:.0f}/{s[k]['p95']:.0f}"
                for k in ("first_token_ms", "first_clause_ms")
            ]
            lines.append(
                f"  {label} {way:27} {cells[0]:>14} {cells[1]:>14} "
                f"{s['ms_per_token']['p50']:>10.1f}"
            )
        for size, b in result["batched"].items():
            lines.append(
                f"  {label} batch of {size} ({b['rows']} rows){'':12} "
                f"{b['first_token_ms']:>14.0f} {'':>14} {b['ms_per_token']:>10.1f}"
                f"  hits {b['keyword_hits']}"
            )
        lines.append(
            f"  {label} key-word hit rate {result['keyword_hit_rate']:.0%} (questions alone),"
            f" {result['conversation_hit_rate']:.0%} (in one conversation)"
        )
    lines.append(
        "  (p50/p95 ms; conversation_full: the same prompts with no KV kept; a batch: p50 of"
        " its rows)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="thread counts to compare")
    parser.add_argument("--weights", default="fp32", help="weight formats to compare")
    parser.add_argument("--batch", default="4", help="batch sizes to measure (empty: none)")
    parser.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        batches = [int(b) for b in args.batch.split(",") if b]
        print(json.dumps(asyncio.run(_measure(args.child, args.weights, batches))))
        return
    with _busy_core(args.busy):
        results = [
            _run_child(int(t), w, args.batch)
            for t in args.threads.split(",")
            for w in args.weights.split(",")
        ]
    print(_table(results, args.busy))
    if args.json:
        args.json.write_text(json.dumps({"busy": args.busy, "results": results}, indent=2))


if __name__ == "__main__":
    main()
