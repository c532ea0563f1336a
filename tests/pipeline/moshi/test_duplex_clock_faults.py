"""The duplex engine's clock under faults (pipeline/engines/moshi/duplex_engine.py): it runs
off the event loop, survives a failed frame, fails one session's bad input alone, and a
clock that dies or stalls puts the engine down (its sessions ended with the reason, new
ones refused, `stalled` naming it) until it is healthy again.

The faults are injected through seams: the model's frame (`_frame`) or the frame step
(`FrameStepper.step` / `join`) replaced by one that raises or sleeps, and a sticky CUDA
error as the RuntimeError text PyTorch raises for one (CI has no GPU). The scripted
stand-in (tests/fakes/scripted_duplex.py) is the real engine with a cheap frame; the toy
Moshi is used where the frame step itself is the seam."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from pipeline.duplex import DuplexDown, DuplexFailed
from pipeline.engines.moshi.duplex_engine import FRAME_S, MoshiDuplexEngine
from pipeline.engines.moshi.duplex_session import DuplexSession, VoiceFrame
from pipeline.engines.moshi.frame_step import Sampling
from pipeline.engines.moshi.mimi_frames import FRAME_SAMPLES
from tests.fakes.scripted_duplex import ScriptedDuplex

STICKY = "CUDA error: an illegal memory access was encountered"


class Reader:
    """A session's voice read as a transport reads it; `failure`: the DuplexFailed text."""

    def __init__(self, session: DuplexSession) -> None:
        self.frames: list[VoiceFrame] = []
        self.failure: str | None = None
        self.task = asyncio.ensure_future(self._read(session))

    async def _read(self, session: DuplexSession) -> None:
        try:
            async for frame in session.frames():
                self.frames.append(frame)
        except DuplexFailed as exc:
            self.failure = str(exc)

    async def ended(self, timeout: float = 30) -> None:
        await asyncio.wait_for(asyncio.shield(self.task), timeout)

    async def more(self, count: int, timeout: float = 30) -> None:
        """Wait for `count` more frames."""
        target = len(self.frames) + count
        async with asyncio.timeout(timeout):
            while len(self.frames) < target:
                await asyncio.sleep(FRAME_S / 4)


@pytest.fixture
async def readers() -> AsyncIterator[list[Reader]]:
    made: list[Reader] = []
    yield made
    for reader in made:
        reader.task.cancel()
        await asyncio.gather(reader.task, return_exceptions=True)


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedDuplex]:
    exits: list[str] = []
    engine = ScriptedDuplex(rows=2)
    engine.stall_s, engine.restart_s = 0.8, 0.2
    engine._exit_process = exits.append  # the seam: the process would exit here
    engine.exits = exits  # type: ignore[attr-defined]
    await engine.start()
    yield engine
    await engine.close()


@pytest.fixture
async def tiny() -> AsyncIterator[MoshiDuplexEngine]:
    # (stall_s: a loaded CI machine's toy frame may take seconds; no stall is tested on it)
    engine = MoshiDuplexEngine(tiny=True, rows=2, sampling=Sampling(greedy=True), stall_s=30)
    await engine.start()
    yield engine
    await engine.close()


def failing(real: Callable[..., Any], times: float, error: str = "a frame went wrong") -> Any:
    """`real`, raising RuntimeError(error) its first `times` calls."""
    calls = [0]

    def frame(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] <= times:
            raise RuntimeError(error)
        return real(*args)

    return frame


async def until(condition: Callable[[], object], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def test_a_frame_that_raises_once_is_survived_and_counted(
    tiny: MoshiDuplexEngine, readers: list[Reader]
) -> None:
    reader = Reader(tiny.open("a"))
    readers.append(reader)
    await reader.more(2)
    stepper = tiny._stepper
    assert stepper is not None
    stepper.step = failing(stepper.step, 1)  # type: ignore[method-assign]
    await reader.more(3)  # the session goes on past the failed frame
    assert tiny.stats.failed_steps == 1
    assert tiny.down is None and tiny.stalled(5) is None and tiny.restarts == 0
    assert reader.failure is None
    assert [f.index for f in reader.frames] == list(range(len(reader.frames)))


async def test_a_clock_that_dies_ends_its_sessions_and_restarts(
    scripted: ScriptedDuplex, readers: list[Reader]
) -> None:
    reader = Reader(scripted.open("a"))
    readers.append(reader)
    await reader.more(1)
    real = scripted._frame
    scripted._frame = failing(real, float("inf"))  # type: ignore[method-assign]
    await reader.ended()
    assert reader.failure is not None and "a frame went wrong" in reader.failure
    assert "5 frames in a row" in reader.failure
    reason = scripted.stalled(5)
    assert reason is not None and "frame clock died" in reason
    with pytest.raises(DuplexDown, match="frame clock died"):
        scripted.open("b")
    scripted._frame = real  # type: ignore[method-assign]
    await until(lambda: scripted.down is None)  # restarted in-process, rows cleared
    assert scripted.restarts == 1 and scripted.stalled(5) is None
    again = Reader(scripted.open("b"))
    readers.append(again)
    await again.more(2)
    assert scripted.exits == []  # type: ignore[attr-defined]


async def test_a_sticky_device_error_ends_the_process(
    scripted: ScriptedDuplex, readers: list[Reader]
) -> None:
    reader = Reader(scripted.open("a"))
    readers.append(reader)
    scripted._frame = failing(scripted._frame, 1, STICKY)  # type: ignore[method-assign]
    await reader.ended()
    assert reader.failure is not None and "illegal memory access" in reader.failure
    await until(lambda: scripted.exits)  # type: ignore[attr-defined]
    assert "illegal memory access" in scripted.exits[0]  # type: ignore[attr-defined]
    assert scripted.stats.failed_steps == 1  # one sticky frame is enough
    assert scripted.restarts == 0 and scripted.down is not None  # no restart in-process


async def test_a_stalled_frame_is_detected_within_the_bound(
    scripted: ScriptedDuplex, readers: list[Reader]
) -> None:
    reader = Reader(scripted.open("a"))
    readers.append(reader)
    await reader.more(1)
    real = scripted._frame

    def stuck(heard: dict[str, Any]) -> Any:
        scripted._frame = real  # type: ignore[method-assign]
        time.sleep(2.0)
        return real(heard)

    scripted._frame = stuck  # type: ignore[method-assign]
    began = time.monotonic()
    await reader.ended()
    detected = time.monotonic() - began
    assert detected < 2.0, detected  # before the stuck frame came back
    assert reader.failure is not None and "no progress" in reader.failure
    assert scripted.stalled(5) is not None
    with pytest.raises(DuplexDown):
        scripted.open("b")
    await until(lambda: scripted.down is None)  # the frame came back: healthy again
    again = Reader(scripted.open("b"))
    readers.append(again)
    await again.more(2)
    assert scripted.restarts == 0


async def test_one_sessions_bad_frame_fails_only_that_session(
    scripted: ScriptedDuplex, readers: list[Reader]
) -> None:
    a, b = scripted.open("a"), scripted.open("b")
    read_a, read_b = Reader(a), Reader(b)
    readers.extend([read_a, read_b])
    await read_b.more(1)
    with pytest.raises(ValueError, match="1-D PCM16"):
        a.feed(np.zeros((2, FRAME_SAMPLES), np.int16))  # refused at the door
    a._inbox.append(np.zeros(7, np.int16))  # a wrong-length frame that got past it
    await read_a.ended()
    assert read_a.failure is not None and "malformed" in read_a.failure
    await read_b.more(3)  # the other session goes on
    assert read_b.failure is None and scripted.sessions == 1
    assert scripted.stats.failed_sessions == 1 and scripted.stats.failed_steps == 0


async def test_one_sessions_row_error_fails_only_that_session(
    tiny: MoshiDuplexEngine, readers: list[Reader]
) -> None:
    stepper = tiny._stepper
    assert stepper is not None
    real = stepper.join

    def join(session_id: str) -> None:
        if session_id == "b":
            raise RuntimeError("no row for b")
        real(session_id)

    stepper.join = join  # type: ignore[method-assign]
    read_a, read_b = Reader(tiny.open("a")), Reader(tiny.open("b"))
    readers.extend([read_a, read_b])
    await read_b.ended()
    assert read_b.failure is not None and "no row for b" in read_b.failure
    await read_a.more(3)
    assert read_a.failure is None and tiny.stats.failed_steps == 0


async def test_a_slow_frame_never_blocks_the_event_loop(
    scripted: ScriptedDuplex, readers: list[Reader]
) -> None:
    real = scripted._frame

    def slow(heard: dict[str, Any]) -> Any:
        time.sleep(0.3)
        return real(heard)

    scripted._frame = slow  # type: ignore[method-assign]
    readers.append(Reader(scripted.open("a")))
    worst = 0.0
    began = time.monotonic()
    while time.monotonic() - began < 0.9:  # three slow frames
        asked = time.monotonic()
        await asyncio.sleep(0.01)
        worst = max(worst, time.monotonic() - asked - 0.01)
    assert worst < 0.05, worst  # the 300 ms frames ran on the model's thread
    assert scripted.stats.late_steps >= 1


async def test_a_frame_stuck_past_the_bound_ends_the_process(
    scripted: ScriptedDuplex, readers: list[Reader]
) -> None:
    """A frame that never comes back holds the model's only thread: nothing in-process can
    restart the clock, so the process exits (the seam records it) for its supervisor."""
    scripted.stuck_s = 0.3
    release = asyncio.Event()
    real = scripted._frame
    loop = asyncio.get_running_loop()

    def stuck(heard: dict[str, Any]) -> Any:
        scripted._frame = real  # type: ignore[method-assign]
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        return real(heard)

    scripted._frame = stuck  # type: ignore[method-assign]
    reader = Reader(scripted.open("a"))
    readers.append(reader)
    try:
        await until(lambda: scripted.exits)  # type: ignore[attr-defined]
    finally:
        release.set()
    assert "stuck past 0.3 s" in scripted.exits[0]  # type: ignore[attr-defined]
    assert reader.failure is not None
