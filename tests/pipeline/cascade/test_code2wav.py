"""Code2Wav renders phoneme ids to speech at the requested rate, batching concurrent clauses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np
from piper import PiperVoice

from pipeline.engines.cascade.code2wav import Code2WavEngine
from pipeline.engines.cascade.voice import clause_phoneme_ids
from pipeline.types import AudioChunk, Chunk, CodecCodes, End, PipelineRequest, StageInput


def clause_input(voice: PiperVoice, rid: str, clauses: list[str], rate: int) -> StageInput:
    async def upstream() -> AsyncIterator[Chunk]:
        for text in clauses:
            yield CodecCodes(codes=clause_phoneme_ids(voice, text), metadata={"text": text})
        yield End()

    request = PipelineRequest(
        request_id=rid, audio=np.zeros(0, dtype=np.int16), output_sample_rate=rate
    )
    return StageInput(request, upstream())


async def test_renders_each_clause_to_audible_speech_at_the_output_rate(voice: PiperVoice) -> None:
    engine = Code2WavEngine()
    await engine.start()
    try:
        clauses = ["Hello there,", "the capital of France is Paris."]
        started = time.perf_counter()
        chunks = [
            c async for c in engine.generate("r1", clause_input(voice, "r1", clauses, 24_000))
        ]
        took = time.perf_counter() - started
    finally:
        await engine.close()
    audio = [c for c in chunks if isinstance(c, AudioChunk)]
    assert len(audio) == 2 and isinstance(chunks[-1], End)
    seconds = sum(a.duration_ms for a in audio) / 1000
    print(f"\nrendered {seconds:.2f} s of speech in {took:.2f} s")
    for chunk in audio:
        assert chunk.sample_rate == 24_000 and chunk.pcm.dtype == np.int16
        assert 300 < chunk.duration_ms < 5_000
        assert np.sqrt(np.mean(chunk.pcm.astype(np.float64) ** 2)) > 1_000  # not silence
    assert engine.active_requests() == 0


async def test_concurrent_clauses_render_in_one_batch_cut_to_length(voice: PiperVoice) -> None:
    engine = Code2WavEngine(batch_window_ms=50)
    await engine.start()
    try:
        short = clause_input(voice, "short", ["Hi."], 16_000)
        long = clause_input(
            voice, "long", ["This sentence is a good deal longer than the other one."], 16_000
        )

        async def render(rid: str, inputs: StageInput) -> list[AudioChunk]:
            return [c async for c in engine.generate(rid, inputs) if isinstance(c, AudioChunk)]

        short_audio, long_audio = await asyncio.gather(render("short", short), render("long", long))
        assert engine.batch_size == 2
    finally:
        await engine.close()
    assert short_audio[0].duration_ms < 1_000 < long_audio[0].duration_ms
    tail = short_audio[0].pcm[-1_600:].astype(np.float64)  # the last 100 ms
    assert np.sqrt(np.mean(tail**2)) < 3_000  # cut where the clause ends, not padded on


async def test_abort_mid_stream_leaves_no_state(voice: PiperVoice) -> None:
    engine = Code2WavEngine()
    await engine.start()
    try:
        inputs = clause_input(voice, "r3", ["One clause.", "Two clauses.", "Three."], 24_000)
        seen = 0
        async for chunk in engine.generate("r3", inputs):
            if isinstance(chunk, AudioChunk):
                seen += 1
                await engine.abort("r3")
        assert seen == 1 and engine.active_requests() == 0
    finally:
        await engine.close()
