"""Capacity as a contract on the tiny Qwen3-Omni graph with 2 cache rows a stage: the engines
state what they serve; a turn beyond the rows waits for one and is then served, never
stepped the plain way; past its wait it fails `server_busy`; a waiter that goes away leaves
nothing; a turn longer than a row fails `context_length_exceeded`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import generate_latest

from pipeline.engines.qwen3_omni.talker import TalkerEngine
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import AudioChunk, End, ErrorChunk, PipelineRequest, TextDelta

from .conftest import turn_audio

TOKENS = 8
FRAMES = 6


def rows_graph(*, row_wait_s: float = 30.0, max_context: int = 2048) -> str:
    rows = f"decode_rows: 2, row_wait_s: {row_wait_s}, max_context: {max_context}"
    return f"""\
name: qwen3_omni_two_rows
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {{tiny: true, threads: 1, max_new_tokens: {TOKENS}, min_new_tokens: {TOKENS},
                  {rows}}}
  - name: talker
    engine: qwen3_omni.talker
    engine_args: {{tiny: true, threads: 1, max_frames: {FRAMES}, min_frames: {FRAMES}, {rows}}}
  - name: code2wav
    engine: qwen3_omni.code2wav
    engine_args: {{tiny: true, first_chunk: 2, chunk: 3, left_context: 3}}
edges:
  - {{from: thinker, to: talker}}
  - {{from: talker, to: code2wav}}
outputs: [thinker, code2wav]
"""


async def started(text: str) -> tuple[StageGraph, ThinkerEngine, TalkerEngine]:
    config = parse_graph(text)
    engines = build_engines(config)
    graph = StageGraph(config, engines)
    await graph.start()
    thinker, talker = engines["thinker"], engines["talker"]
    assert isinstance(thinker, ThinkerEngine) and isinstance(talker, TalkerEngine)
    return graph, thinker, talker


@pytest.fixture
async def two_rows() -> AsyncIterator[tuple[StageGraph, ThinkerEngine, TalkerEngine]]:
    graph, thinker, talker = await started(rows_graph())
    try:
        yield graph, thinker, talker
    finally:
        await graph.close()


async def answer(graph: StageGraph, rid: str) -> tuple[int, int, ErrorChunk | None]:
    """(text deltas, audio samples, the error it ended with, if any)."""
    request = PipelineRequest(request_id=rid, audio=turn_audio(0.5, seed=len(rid)))
    words, samples = 0, 0
    async for chunk in graph.generate(request):
        match chunk:
            case TextDelta():
                words += 1
            case AudioChunk():
                samples += len(chunk.pcm)
            case ErrorChunk():
                return words, samples, chunk
            case End():
                break
    return words, samples, None


def rows_back(*engines: ThinkerEngine | TalkerEngine) -> bool:
    for engine in engines:
        assert engine.rows is not None
        if engine.rows.in_use or engine.rows.queued:
            return False
    return True


async def settled(*engines: ThinkerEngine | TalkerEngine) -> None:
    """Until every row is back (the model threads run the queued releases first)."""
    async with asyncio.timeout(10):
        while not rows_back(*engines):
            await asyncio.sleep(0.01)


async def test_the_engines_state_their_rows_and_a_third_turn_waits_then_is_served(
    two_rows: tuple[StageGraph, ThinkerEngine, TalkerEngine],
) -> None:
    graph, thinker, talker = two_rows
    for engine in (thinker, talker):
        stated = engine.capacity()
        assert stated is not None
        assert (stated.rows, stated.waiting, stated.holds) == (2, 2, "turn")
        assert stated.memory_bytes > 0
    capacity = graph.capacity()
    assert capacity is not None and capacity.sessions == 4
    assert thinker.runner is not None and talker.runner is not None
    async with asyncio.timeout(60):
        results = await asyncio.gather(*(answer(graph, rid) for rid in ("a", "bb", "ccc")))
    for words, samples, error in results:
        assert error is None and words == TOKENS and samples > 0
    assert thinker.runner.plain_steps == talker.runner.plain_steps == 0
    await settled(thinker, talker)
    assert thinker.rows is not None and thinker.rows.refused == 0


async def test_a_waiting_turn_enters_the_graph_only_once_a_whole_answer_is_made(
    two_rows: tuple[StageGraph, ThinkerEngine, TalkerEngine],
) -> None:
    """Not when the first turns' replies are chosen (their Thinker rows free) but when one of
    their answers has its last audio: so the admitted turns' Talker never shares the GPU
    with more turns than it has rows (64 offered on the H200 stalled without it)."""
    graph, thinker, talker = two_rows
    began = asyncio.get_running_loop().time()
    seen: dict[str, list[float]] = {}

    async def timed(rid: str) -> None:
        request = PipelineRequest(request_id=rid, audio=turn_audio(0.5, seed=len(rid)))
        async for chunk in graph.generate(request):
            if isinstance(chunk, TextDelta | End):
                seen.setdefault(rid, []).append(asyncio.get_running_loop().time() - began)
            assert not isinstance(chunk, ErrorChunk), chunk

    async with asyncio.timeout(60):
        await asyncio.gather(*(timed(rid) for rid in ("a", "bb", "ccc")))
    first_done = min(seen["a"][-1], seen["bb"][-1])
    assert seen["ccc"][0] > first_done  # its first word after an answer ended, not before
    assert graph.admission is not None and graph.admission.gate.refused == 0
    await settled(thinker, talker)


async def test_the_graph_admits_as_many_turns_as_its_fewest_rows_and_transcripts_pass() -> None:
    text = rows_graph().replace(
        f"max_frames: {FRAMES}, min_frames: {FRAMES}, decode_rows: 2",
        f"max_frames: {FRAMES}, min_frames: {FRAMES}, decode_rows: 1",
    )
    graph, thinker, talker = await started(text)
    try:
        assert graph.admission is not None
        gate = graph.admission.gate
        assert (gate.rows, gate.waiting) == (1, 1)  # the Talker's 1 row, its 1 place to wait
        scraped = generate_latest(graph.metrics.registry).decode()
        assert 'parley_stage_rows_in_use{stage="graph"} 0.0' in scraped
        # a transcription-only turn (no answer follows) holds no graph row
        held = asyncio.create_task(answer(graph, "a"))
        async with asyncio.timeout(10):
            while gate.in_use < 1:
                await asyncio.sleep(0.005)
        request = PipelineRequest(request_id="t", audio=turn_audio(0.3), transcribe_only=True)
        async with asyncio.timeout(10):
            chunks = [chunk async for chunk in graph.generate(request)]
        assert isinstance(chunks[-1], End) and gate.queued == 0
        async with asyncio.timeout(60):
            assert (await held)[2] is None
        await settled(thinker, talker)
    finally:
        await graph.close()


async def test_past_its_wait_a_turn_fails_server_busy_and_an_aborted_waiter_leaves_nothing() -> (
    None
):
    graph, thinker, talker = await started(rows_graph(row_wait_s=0.02))
    try:
        async with asyncio.timeout(60):
            results = await asyncio.gather(*(answer(graph, rid) for rid in ("a", "bb", "ccc")))
        busy = [error for _, _, error in results if error is not None]
        assert len(busy) == 1 and busy[0].code == "server_busy"
        assert "all 2 rows" in busy[0].message and "busy" in busy[0].message
        assert sum(error is None for _, _, error in results) == 2
        scraped = generate_latest(graph.metrics.registry).decode()
        # the turn waited in front of the graph (graph_admission.py), not at a stage
        assert 'parley_stage_turns_refused_total{stage="graph"} 1.0' in scraped
        assert 'parley_stage_turns_refused_total{stage="thinker"} 0.0' in scraped
        await settled(thinker, talker)

        # a waiter whose caller goes away leaves the queue, and its row is never taken
        assert graph.admission is not None and thinker.rows is not None
        gate = graph.admission.gate
        gate.wait_s = 30.0
        first = [asyncio.create_task(answer(graph, rid)) for rid in ("d", "ee")]
        async with asyncio.timeout(10):
            while gate.in_use < 2:
                await asyncio.sleep(0.005)
        waiter = asyncio.create_task(answer(graph, "fff"))
        async with asyncio.timeout(10):
            while gate.queued < 1:
                await asyncio.sleep(0.005)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert gate.queued == 0 and not gate.holds("fff") and not thinker.rows.holds("fff")
        async with asyncio.timeout(60):
            for served in await asyncio.gather(*first):
                assert served[2] is None
        await settled(thinker, talker)
        assert gate.in_use == gate.queued == 0
        assert thinker.active_requests() == talker.active_requests() == 0
        assert thinker.runner is not None and thinker.runner.plain_steps == 0
    finally:
        await graph.close()


async def test_a_turn_longer_than_a_row_fails_context_length_exceeded() -> None:
    graph, thinker, talker = await started(rows_graph(max_context=64))
    try:
        request = PipelineRequest(request_id="long", audio=turn_audio(0.1), text="word " * 80)
        chunks = [chunk async for chunk in graph.generate(request)]
        assert isinstance(chunks[-1], ErrorChunk)
        assert chunks[-1].code == "context_length_exceeded"
        assert "64" in chunks[-1].message
        await settled(thinker, talker)
    finally:
        await graph.close()


async def test_plain_fallback_only_where_the_graph_asks_for_it() -> None:
    text = rows_graph().replace("decode_rows: 2,", "decode_rows: 1, plain_fallback: true,")
    graph, thinker, talker = await started(text)
    try:
        assert thinker.rows is None and thinker.capacity() is None
        assert graph.capacity() is None  # admission keeps its configured cap
        async with asyncio.timeout(60):
            results = await asyncio.gather(*(answer(graph, rid) for rid in ("a", "bb")))
        assert all(error is None for _, _, error in results)
        assert thinker.runner is not None and thinker.runner.plain_steps > 0
    finally:
        await graph.close()
