"""The duplex engine on the toy Moshi (and its scripted stand-in), in real time: one clock
for every session, sessions joining mid-stream, late frames counted and never skipped, a
standing queue of microphone frames cut back, a full model saying so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from pipeline.engines.moshi.duplex_engine import (
    FRAME_S,
    STANDING_TICKS,
    DuplexSession,
    DuplexStats,
    MoshiDuplexEngine,
    RowsFull,
    SessionClosed,
    VoiceFrame,
)
from pipeline.engines.moshi.frame_step import Sampling
from pipeline.engines.moshi.mimi_frames import FRAME_SAMPLES
from tests.fakes.scripted_duplex import ScriptedDuplex


@pytest.fixture(params=["moshi_tiny", "scripted"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[MoshiDuplexEngine]:
    """The toy Moshi, and the scripted stand-in that the session layer's tests use
    (tests/fakes/scripted_duplex.py): both keep the engine's contract."""
    if request.param == "scripted":
        engine: MoshiDuplexEngine = ScriptedDuplex(rows=2)
    else:
        engine = MoshiDuplexEngine(tiny=True, rows=2, sampling=Sampling(greedy=True))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()
        await engine.close()  # idempotent


async def collect(session: DuplexSession, into: list[VoiceFrame]) -> None:
    async for frame in session.frames():
        into.append(frame)


def speech(seconds: float) -> np.ndarray:
    rng = np.random.default_rng(1)
    return (rng.standard_normal(int(24_000 * seconds)) * 3000).astype(np.int16)


async def test_one_clock_serves_every_session_and_one_joins_mid_stream(
    engine: MoshiDuplexEngine,
) -> None:
    first = engine.open("a")
    heard_a: list[VoiceFrame] = []
    heard_b: list[VoiceFrame] = []
    first.feed(speech(2.0))
    began = time.monotonic()
    async with asyncio.TaskGroup() as tasks:
        reading_a = tasks.create_task(collect(first, heard_a))
        await asyncio.sleep(0.8)
        second = engine.open("b")
        second.feed(speech(1.0)[: FRAME_SAMPLES * 3 + 100])  # a part frame waits for more
        reading_b = tasks.create_task(collect(second, heard_b))
        await asyncio.sleep(0.8)
        engine.leave("a")
        engine.leave("b")
    elapsed = time.monotonic() - began
    for frames in (heard_a, heard_b):
        assert [f.index for f in frames] == list(range(len(frames)))  # no gap
        assert all(f.pcm.shape == (FRAME_SAMPLES,) and f.pcm.dtype == np.int16 for f in frames)
        assert not frames[0].pcm.any()  # no whole frame of the voice yet: silence
    expected = elapsed / FRAME_S
    assert 0.5 * expected <= len(heard_a) <= expected + 2, (len(heard_a), elapsed)
    assert 3 <= len(heard_b) < len(heard_a)
    assert engine.stats.unheard_frames > 0  # b's microphone ran out: heard as silence
    assert reading_a.done() and reading_b.done()
    assert engine.sessions == 0


async def test_a_full_model_refuses_a_session_until_one_leaves(engine: MoshiDuplexEngine) -> None:
    engine.open("a")
    engine.open("b")
    assert engine.open("a") is engine.open("a")
    with pytest.raises(RowsFull):
        engine.open("c")
    engine.leave("a")
    engine.leave("a")
    engine.open("c")
    await asyncio.sleep(3 * FRAME_S)  # rows change between frames
    assert engine.sessions == 2


async def test_a_late_frame_is_counted_and_not_skipped(engine: MoshiDuplexEngine) -> None:
    real = engine._frame

    def slow(heard: dict[str, Any]) -> Any:
        time.sleep(FRAME_S * 1.5)
        return real(heard)

    engine._frame = slow  # type: ignore[method-assign]
    session = engine.open("a")
    frames: list[VoiceFrame] = []
    reader = asyncio.create_task(collect(session, frames))
    await asyncio.sleep(0.6)
    engine.leave("a")
    await reader
    assert engine.stats.late_steps >= 2
    assert engine.stats.worst_late_ms > 0
    assert [f.index for f in frames] == list(range(len(frames)))


async def test_a_closed_engine_ends_its_sessions_and_opens_none() -> None:
    engine = MoshiDuplexEngine(tiny=True, rows=1)
    await engine.start()
    session = engine.open("a")
    frames: list[VoiceFrame] = []
    reader = asyncio.create_task(collect(session, frames))
    await asyncio.sleep(0.3)
    await engine.close()
    await asyncio.wait_for(reader, 5)  # the voice stream ended with the engine
    with pytest.raises(SessionClosed):
        engine.open("b")


async def test_frames_piled_up_by_a_stall_are_cut_back_and_speech_is_kept() -> None:
    """A stall leaves frames waiting; a microphone in real time never drains them, so the
    model would hear the user late for the rest of the call. The inbox cuts the standing
    queue back (the quiet frames first), and a burst that drains by itself is never cut."""
    session = DuplexSession("a", DuplexStats())
    quiet, loud = np.zeros(FRAME_SAMPLES, np.int16), np.full(FRAME_SAMPLES, 4000, np.int16)
    session.feed(np.concatenate([loud] * 5))  # a stall left five frames waiting
    heard = []
    for tick in range(STANDING_TICKS + 4):  # a microphone in real time: a frame a tick
        session.feed(loud if tick % 2 else quiet)  # words and the gaps between them
        heard.append(session.next_heard())
    assert session.stats.skipped_in == 5  # down to the frame due now
    assert heard[STANDING_TICKS - 1].any()  # of the six waiting, the quiet ones went first
    assert len(session._inbox) == 0

    bursty = DuplexSession("b", DuplexStats())
    for tick in range(4 * STANDING_TICKS):  # 1 s chunks, in real time
        if tick % 12 == 0:
            bursty.feed(np.concatenate([loud] * 12))
        bursty.next_heard()
    assert bursty.stats.skipped_in == 0
