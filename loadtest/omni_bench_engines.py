"""The benchmark's single-engine phases: a follow-up turn's prefill, and Code2Wav per chunk.

Both build one engine of the graph file (omni_graph.py: the file with the command's
overrides), with the engine arguments its stage has there, in the phase's own process, and
drive it through its public `generate` (the graph is not needed to time one stage, and a
stage in a worker process cannot be timed from outside).

`kv_reuse`: the graph's Thinker (its session KV and prefix cache as the file sizes them),
a session of `--kv-turns` turns (each: audio, camera frames and the question; the history
holds the earlier turns as text, with item ids, as a session sends it). The time of turn
k >= 2 from the request to the prompt's hidden states (log-mel features, image patches and
the prefill) is measured with reuse on (the session's KV: the turn prefills only what it
adds), then the same request again outside the session with the prefix cache detached, on
the same engine (same weights, warm kernels).

`code2wav`: the graph's Code2Wav (its chunks, its `max_batch`), fed a whole answer's codec
frames (the Talker's `max_frames`) at once by `concurrency` requests together, so the time
between its audio chunks is its decode time per chunk (the first, small chunk, then full
chunks with their left context), batched as concurrent requests are in the graph: at most
`max_batch` at once, the rest waiting their turn.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .omni_bench_input import QUESTION, make_request, out_of_time
from .omni_bench_report import percentiles
from .omni_graph import engine_setting, flat_graph

SESSION = "bench_session"


def history_item(role: str, text: str, item_id: str) -> Any:
    from pipeline.types import HistoryItem

    return HistoryItem(role, text, item_id=item_id)  # type: ignore[arg-type]


def without_session(request: Any) -> Any:
    """The same request outside any session (the field's default), if requests have one."""
    for f in dataclasses.fields(request):
        if f.name == "session_id":
            return dataclasses.replace(request, session_id=f.default)
    return request


@contextmanager
def reuse_off(engine: Any) -> Iterator[None]:
    """The Thinker with its prefix cache detached (session reuse is off for requests
    without a session id)."""
    runner: Any = getattr(engine, "runner", None)
    kept = getattr(runner, "prefix_cache", None)
    if kept is not None:
        runner.prefix_cache = None
    try:
        yield
    finally:
        if kept is not None:
            runner.prefix_cache = kept


async def timed_turn(engine: Any, request: Any, *, finish: bool) -> tuple[dict[str, Any], str]:
    """Prefill time and sizes of one turn; the reply text when `finish` (else it is aborted
    once the prompt is in: closing the stream aborts the request)."""
    from pipeline.types import ErrorChunk, HiddenStates, TextDelta

    started = time.perf_counter()
    figures: dict[str, Any] = {}
    reply: list[str] = []
    stream = engine.generate(request.request_id, request)
    try:
        async for chunk in stream:
            if isinstance(chunk, ErrorChunk):
                raise RuntimeError(f"thinker failed: {chunk.message}")
            if isinstance(chunk, HiddenStates) and chunk.metadata.get("part") == "prompt":
                figures["prefill_ms"] = 1000 * (time.perf_counter() - started)
                figures["prompt_chunk_tokens"] = len(chunk.metadata["token_ids"])
                prefilled = getattr(getattr(engine, "runner", None), "last_prefill_tokens", None)
                if prefilled is not None:
                    figures["prefilled_tokens"] = int(prefilled)
                if not finish:
                    break
            elif isinstance(chunk, TextDelta):
                reply.append(chunk.text)
    finally:
        await stream.aclose()
    return figures, "".join(reply).strip()


def _summary(turns: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("prefill_ms", "prefilled_tokens", "prompt_chunk_tokens")
    return {key: percentiles([t[key] for t in turns if key in t]) for key in keys}


async def kv_reuse_phase(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.engines.qwen3_omni.thinker import ThinkerEngine

    engine_args = flat_graph(args).engine_kwargs("thinker")
    engine = ThinkerEngine(**engine_args)
    built = time.perf_counter()
    await engine.start()
    result: dict[str, Any] = {
        "start_s": time.perf_counter() - built,
        "mechanism": "session_kv",
        "engine_args": engine_args,
        "turns": args.kv_turns,
        "reuse_off": "the same engine and request, outside the session, prefix cache detached",
    }
    on: dict[int, list[dict[str, Any]]] = {k: [] for k in range(1, args.kv_turns + 1)}
    off: dict[int, list[dict[str, Any]]] = {k: [] for k in range(2, args.kv_turns + 1)}
    try:
        session_s = 0.0
        for session in range(-args.warmup, args.kv_reps):  # negative: warm-up, not kept
            if out_of_time(args, session_s):
                result["stopped"] = f"time limit before session {session}"
                break
            began = time.perf_counter()
            history: list[Any] = []
            item_ids: list[str] = []
            for turn in range(1, args.kv_turns + 1):
                item_ids.append(f"user_{turn}")
                session_args = {"session_id": f"{SESSION}_{session}", "item_ids": tuple(item_ids)}
                request = make_request(
                    50_000 + 100 * session + turn, args, history=tuple(history), **session_args
                )
                last = turn == args.kv_turns
                figures, reply = await timed_turn(engine, request, finish=not last)
                if session >= 0:
                    on[turn].append(figures)
                if turn >= 2:
                    with reuse_off(engine):
                        plain = without_session(request)
                        plain = dataclasses.replace(plain, request_id=request.request_id + "_o")
                        figures, _ = await timed_turn(engine, plain, finish=False)
                    if session >= 0:
                        off[turn].append(figures)
                said = f"[call {session}] {QUESTION}"  # calls share no history text
                item_ids.append(f"assistant_{turn}")
                history.append(history_item("user", said, f"user_{turn}"))
                history.append(history_item("assistant", reply, f"assistant_{turn}"))
            session_s = time.perf_counter() - began
        result["turn1"] = {"reuse_on": _summary(on[1])}
        for turn in range(2, args.kv_turns + 1):
            with_reuse, without = _summary(on[turn]), _summary(off[turn])
            a = without["prefill_ms"].get("p50")
            b = with_reuse["prefill_ms"].get("p50")
            pairs = zip(on[turn], off[turn], strict=True)
            result[f"turn{turn}"] = {
                "reuse_on": with_reuse,
                "reuse_off": without,
                "speedup_p50": a / b if a and b else None,
                # random weights may end a reply on an id that keeps no session entry
                "turns_reused": sum(
                    x.get("prefilled_tokens", 0) < y.get("prefilled_tokens", 0) for x, y in pairs
                ),
            }
    finally:
        await engine.close()
    return result


async def _codes(frames: np.ndarray[Any, Any]) -> AsyncIterator[Any]:
    from pipeline.types import CodecCodes, End

    yield CodecCodes(codes=frames)
    yield End()


async def _decode_one(engine: Any, request: Any, frames: np.ndarray[Any, Any]) -> list[float]:
    """Seconds from the request (or the previous chunk) to each audio chunk."""
    from pipeline.types import AudioChunk, ErrorChunk, StageInput

    times: list[float] = []
    last = time.perf_counter()
    async for chunk in engine.generate(request.request_id, StageInput(request, _codes(frames))):
        if isinstance(chunk, ErrorChunk):
            raise RuntimeError(f"code2wav failed: {chunk.message}")
        if isinstance(chunk, AudioChunk):
            now = time.perf_counter()
            times.append(now - last)
            last = now
    return times


async def code2wav_phase(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.engines.qwen3_omni.code2wav import Code2WavEngine
    from pipeline.types import PipelineRequest

    graph = flat_graph(args)
    engine = Code2WavEngine(**graph.engine_kwargs("code2wav"))
    first_chunk, chunk, context = engine.first_chunk, engine.chunk, engine.left_context
    count = int(engine_setting(graph, "talker", "max_frames", 375))
    built = time.perf_counter()
    await engine.start()
    result: dict[str, Any] = {"start_s": time.perf_counter() - built, "max_batch": engine.max_batch}
    try:
        assert engine.config is not None
        code2wav = engine.config.code2wav_config
        quantizers, codebook = int(code2wav.num_quantizers), int(code2wav.codebook_size)
        rng = np.random.default_rng(0)

        async def level(concurrency: int, rep: int) -> list[list[float]]:
            jobs = []
            for i in range(concurrency):
                request = PipelineRequest(f"c2w_{concurrency}_{rep}_{i}", np.zeros(0, np.int16))
                frames = rng.integers(0, codebook, (count, quantizers), dtype=np.int32)
                jobs.append(_decode_one(engine, request, frames))
            return list(await asyncio.gather(*jobs))

        for concurrency in args.concurrency:
            if out_of_time(args, 30.0):
                result[f"c{concurrency}"] = {"skipped": "time limit"}
                continue
            for rep in range(args.warmup):  # each batch size's shapes once untimed
                await level(concurrency, -1 - rep)
            runs = [t for rep in range(args.reps) for t in await level(concurrency, rep)]
            full = (count - first_chunk) // chunk  # chunks of `chunk` frames after the first
            result[f"c{concurrency}"] = {
                "requests": len(runs),
                "frames": count,
                "first_chunk_frames": first_chunk,
                "chunk_frames": chunk,
                "left_context": context,
                "first_chunk_ms": percentiles([1000 * t[0] for t in runs if t]),
                "chunk_ms": percentiles([1000 * s for t in runs for s in t[1 : 1 + full]]),
                "chunks_per_request": percentiles([len(t) for t in runs]),
            }
    finally:
        await engine.close()
    return result
