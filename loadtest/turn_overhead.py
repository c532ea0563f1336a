"""Benchmark: turn overhead, the time past the configured silence window to a response.

A spoken question (espeak-ng) is fed to a real session at microphone pace, 20 ms at a time,
on a real Redis. The user's speech ends at a known instant; the earliest a server-VAD turn
can end is `silence_duration_ms` later. Overhead is the time from that instant to the
`response.created` event and to the pipeline receiving the request (the `echo` engine, so no
model time is counted). Target: within 15 ms of the silence window.

    .venv/bin/python -m loadtest.turn_overhead [--turns 20] [--silence-ms 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from pipeline.engines.echo import EchoEngine
from pipeline.types import Chunk
from sessions.events import Event, ResponseCreated
from sessions.manager import SessionManager
from sessions.sink import DetachedSink
from web.redis_server import EmbeddedRedis

from .speech import silence, speak, trim_silence

QUESTIONS = [
    "What time is it in Tokyo?",
    "Can you tell me a short joke?",
    "How far away is the moon?",
    "Please read me the news headlines.",
    "What should I cook for dinner tonight?",
]


class _TimedEcho(EchoEngine):
    """The echo engine, noting when each request arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[float] = []

    async def generate(self, request_id: str, inputs: Any) -> AsyncGenerator[Chunk, None]:
        self.arrivals.append(time.monotonic())
        async for chunk in super().generate(request_id, inputs):
            yield chunk


class _Sink(DetachedSink):
    """Discards audio at once (no playout wait) and timestamps response.created."""

    def __init__(self) -> None:
        self.created: list[float] = []

    def event(self, event: Event) -> None:
        if isinstance(event, ResponseCreated):
            self.created.append(time.monotonic())


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


async def run(turns: int, silence_ms: int) -> dict[str, float]:
    with EmbeddedRedis() as server:
        redis = aioredis.Redis.from_url(server.url)
        engine = _TimedEcho()
        sink = _Sink()
        try:
            async with SessionManager(redis, EnginePipeline(engine)) as manager:
                session = await manager.create(
                    sink, {"turn_detection": {"silence_duration_ms": silence_ms}}
                )
                overheads_event: list[float] = []
                overheads_engine: list[float] = []
                for turn in range(turns):
                    speech = trim_silence(speak(QUESTIONS[turn % len(QUESTIONS)]))
                    pcm = np.concatenate([silence(300), speech, silence(silence_ms + 700)])
                    speech_end_s = (300 + len(speech) / 16) / 1000
                    before = len(sink.created)
                    start = time.monotonic()
                    for i, offset in enumerate(range(0, len(pcm), 320)):
                        await asyncio.sleep(max(0.0, start + i * 0.02 - time.monotonic()))
                        await session.append_audio(pcm[offset : offset + 320].tobytes())
                    await asyncio.sleep(0.2)
                    if len(sink.created) == before:
                        raise RuntimeError(f"turn {turn}: no response")
                    earliest = start + speech_end_s + silence_ms / 1000
                    overheads_event.append((sink.created[-1] - earliest) * 1000)
                    overheads_engine.append((engine.arrivals[-1] - earliest) * 1000)
                await manager.close_session(session.session_id)
        finally:
            await redis.aclose()
    return {
        "turns": turns,
        "silence_ms": silence_ms,
        "response_created_p50_ms": statistics.median(overheads_event),
        "response_created_p95_ms": _pct(overheads_event, 95),
        "request_at_engine_p50_ms": statistics.median(overheads_engine),
        "request_at_engine_p95_ms": _pct(overheads_engine, 95),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--silence-ms", type=int, default=500)
    args = parser.parse_args()
    figures = asyncio.run(run(args.turns, args.silence_ms))
    print("turn overhead past the silence window (ms; negative = VAD ended the turn early)")
    for name, value in figures.items():
        print(f"  {name:28s} {value:8.1f}" if isinstance(value, float) else f"  {name:28s} {value}")


if __name__ == "__main__":
    main()
