"""Streamed turns of several sessions prefilled in shared batches, each answering as its
whole turn does, and their prefill run behind the decode steps of an answer in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pipeline.engines.qwen3_omni.staging_queue import StagingQueue
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.types import Chunk, TextDelta

from .conftest import turn_audio
from .test_streamed_turns import answer, assert_same, request, stream

REPLY = 4


@pytest.fixture
async def thinker() -> AsyncIterator[ThinkerEngine]:
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_new_tokens=REPLY,
        min_new_tokens=REPLY,
        session_kv_tokens=8192,
        max_context=1024,
        prefill_chunk_tokens=48,
    )
    await engine.start()
    yield engine
    await engine.close()


def staging(engine: ThinkerEngine) -> StagingQueue:
    assert engine.streamed is not None
    return engine.streamed.staging


async def test_windows_of_sessions_speaking_at_once_share_a_batch(thinker: ThinkerEngine) -> None:
    """Three sessions speak 9 s at once: their first windows finish together and are
    prefilled as one batch (in chunks of 48 positions), and each answers as its whole turn."""
    queue = staging(thinker)
    queue.gather_s = 0.5  # the windows are computed within it, however loaded the machine
    audios = {f"b{n}": turn_audio(9.0, seed=20 + n) for n in range(3)}
    whole = {
        s: await answer(thinker, request(f"{s}w", f"{s}w", ("u1",), audio=a))
        for s, a in audios.items()
    }
    for session in audios:
        await thinker.open_turn(session, request("x", session, ("u1",)))
    for start in range(0, 9 * 16_000, 3200):  # 200 ms of each session's audio in turn
        for session, audio in audios.items():
            await thinker.feed_turn(session, audio[start : start + 3200])
    assert thinker.streamed is not None
    for session in audios:  # the staging caught up
        task = thinker.streamed._turns[session].task
        if task is not None:
            await task
    assert (queue.batches, queue.largest_batch) == (2, 3)  # the leads, then the windows
    for session, audio in audios.items():
        streamed = await answer(
            thinker, request(f"{session}s", session, ("u1",), audio=audio, streamed=session)
        )
        assert_same(streamed, whole[session])
    assert thinker.streamed_turns()["prefilled"] == 3


async def answering(engine: ThinkerEngine, session: str, log: list[str]) -> list[Chunk]:
    chunks = []
    async for chunk in engine.generate(
        session, request(session, session, ("u1",), audio=turn_audio(1.0))
    ):
        if isinstance(chunk, TextDelta):
            log.append("token")
            await asyncio.sleep(0.005)  # its reader (the Talker) takes a moment each token
        chunks.append(chunk)
    return chunks


async def test_streamed_prefill_waits_behind_the_decode_steps_of_an_answer() -> None:
    """While one session's answer decodes, another's 17 s turn streams in: its prefill runs
    a chunk at a time, never two chunks between two decode steps of the answer."""
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_new_tokens=60,
        min_new_tokens=60,
        max_context=1024,
        prefill_chunk_tokens=16,
    )
    await engine.start()
    try:
        queue = staging(engine)
        queue.gather_s, queue.yield_s = 0.0, 5.0
        assert engine.runner is not None
        runner = engine.runner
        order: list[str] = []
        steps, chunk = runner.step_batch, queue._run_chunk

        def step_logged(*args: Any, **kwargs: Any) -> Any:
            order.append("step")
            return steps(*args, **kwargs)

        def chunk_logged(*args: Any) -> Any:
            order.append("stage")
            chunk(*args)

        runner.step_batch = step_logged  # type: ignore[method-assign]
        queue._run_chunk = chunk_logged  # type: ignore[method-assign,assignment]
        tokens: list[str] = []
        answer_task = asyncio.ensure_future(answering(engine, "a", tokens))
        while not tokens:
            await asyncio.sleep(0.001)
        await stream(engine, "t", request("x", "b", ("u1",)), turn_audio(17.0, seed=9))
        await answer_task
        first, last = order.index("step"), len(order) - 1 - order[::-1].index("step")
        during = order[first : last + 1]
        assert during.count("stage") >= 3  # the turn streamed in while the answer decoded
        pairs = zip(during, during[1:], strict=False)
        assert ("stage", "stage") not in set(pairs)
        assert queue.chunks_run >= during.count("stage")
    finally:
        await engine.close()
