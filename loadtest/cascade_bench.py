"""Benchmark: cascade voice-to-voice, end of a spoken question to the first audio chunk.

Twenty questions are spoken with Piper's joe voice (resampled to 16 kHz), each handed to the
real `cascade` pipeline as a finished turn, one at a time. The clock starts when the turn
is handed over (the end of the user's speech, as the session core sees it once turn
detection has ended the turn) and stops at the first audio chunk. Each stage's time to
first chunk comes from the graph's own per-stage instrument.

    .venv/bin/python -m loadtest.cascade_bench [--n 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

import numpy as np
import soxr

from pipeline.graph import StageGraph
from pipeline.metrics import PipelineMetrics, RequestKind
from pipeline.registry import load_pipeline
from pipeline.types import AudioChunk, ErrorChunk, PipelineRequest, TextDelta

QUESTIONS = [
    "What is the capital of France?",
    "How many days are there in a week?",
    "What colour is the sky on a clear day?",
    "Can you recommend a good book?",
    "What is the boiling point of water?",
    "Tell me a fun fact about cats.",
    "How do I make a cup of tea?",
    "What is the tallest mountain in the world?",
    "Why do leaves change colour in autumn?",
    "What should I eat for breakfast?",
]


class _RecordingMetrics(PipelineMetrics):
    """The graph's instruments, also keeping each time to first chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.ttfc: dict[str, list[float]] = defaultdict(list)

    def first_chunk(self, stage: str, kind: RequestKind, seconds: float) -> None:
        super().first_chunk(stage, kind, seconds)
        if kind == "answer":
            self.ttfc[stage].append(seconds * 1000)


def spoken(text: str) -> np.ndarray:
    from pipeline.engines.cascade.voice import load_voice

    voice = load_voice()
    chunks = [c.audio_int16_array for c in voice.synthesize(text)]
    pcm = np.concatenate(chunks)
    resampled: np.ndarray = soxr.resample(pcm, voice.config.sample_rate, 16_000)
    return resampled.astype(np.int16)


async def run(n: int) -> dict[str, float]:
    metrics = _RecordingMetrics()
    graph = load_pipeline("cascade", metrics)
    assert isinstance(graph, StageGraph)
    await graph.start()
    first_audio: list[float] = []
    answers = 0
    try:
        warm = PipelineRequest(request_id="resp_warm", audio=spoken("Hello."))
        async for _ in graph.generate(warm):
            pass
        metrics.ttfc.clear()
        for i in range(n):
            audio = spoken(QUESTIONS[i % len(QUESTIONS)])
            request = PipelineRequest(request_id=f"resp_{i}", audio=audio)
            started = time.perf_counter()
            got_audio = False
            async for chunk in graph.generate(request):
                if isinstance(chunk, AudioChunk) and not got_audio:
                    first_audio.append((time.perf_counter() - started) * 1000)
                    got_audio = True
                if isinstance(chunk, TextDelta) and chunk.kind == "output":
                    answers += 1
                if isinstance(chunk, ErrorChunk):
                    raise RuntimeError(f"question {i}: {chunk.stage}: {chunk.message}")
    finally:
        await graph.close()
    figures = {
        "questions": float(n),
        "first_audio_p50_ms": float(np.percentile(first_audio, 50)),
        "first_audio_p95_ms": float(np.percentile(first_audio, 95)),
    }
    for stage, values in metrics.ttfc.items():
        figures[f"{stage}_first_chunk_p50_ms"] = float(np.percentile(values, 50))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description="cascade voice-to-voice latency")
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    figures = asyncio.run(run(args.n))
    print("cascade: end of a spoken question -> first audio chunk")
    for name, value in figures.items():
        print(f"  {name:34} {value:9.1f}")


if __name__ == "__main__":
    main()
