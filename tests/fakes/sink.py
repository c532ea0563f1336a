"""A test output sink that plays audio out in real time, like a transport would.

It is a real PlayoutBuffer driven by a 20 ms clock task, so the playback cursor, clearing
and backpressure behave as they do behind a WebRTC track. Events are recorded in order.
Its frames are 20 ms of the given `Clock` (a `ScaledClock` plays faster than real time,
with the session on the same clock), and the times it records are on that clock too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from pipeline.audio_format import FRAME_MS, OUTPUT_SAMPLE_RATE
from pipeline.tasks import cancel_and_wait
from sessions.clock import REAL_CLOCK, Clock
from sessions.events import Event
from sessions.playout import PlayoutBuffer, PlayoutSink

E = TypeVar("E", bound=Event)


class ClockedSink(PlayoutSink):
    def __init__(self, sample_rate: int = OUTPUT_SAMPLE_RATE, clock: Clock = REAL_CLOCK) -> None:
        super().__init__(PlayoutBuffer(sample_rate))
        self.clock = clock
        self.events: list[Event] = []
        self.played_audio_frames = 0
        self.last_audio_at: float | None = None
        self.cleared_at: list[float] = []
        self.played_ms_at_clear: list[int] = []
        self.paused_at: list[float] = []
        self._clock: asyncio.Task[None] | None = None
        self._new_event = asyncio.Event()

    async def __aenter__(self) -> ClockedSink:
        self._clock = asyncio.create_task(self._run_clock(), name="test-sink-clock")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cancel_and_wait(self._clock)
        self._clock = None

    async def _run_clock(self) -> None:
        clock = self.clock
        next_at = clock.now()
        while True:
            frame = self.playout.next_frame()
            if frame is not self.playout.silence:
                self.played_audio_frames += 1
                self.last_audio_at = clock.now()
            next_at += FRAME_MS / 1000
            await clock.sleep(max(0.0, next_at - clock.now()))

    # --- OutputSink ---
    def event(self, event: Event) -> None:
        self.events.append(event)
        self._new_event.set()

    def clear(self) -> None:
        self.cleared_at.append(self.clock.now())
        self.played_ms_at_clear.append(self.playout.played_ms)
        super().clear()

    def pause(self) -> None:
        self.paused_at.append(self.clock.now())
        super().pause()

    # --- test helpers ---
    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def of(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]

    async def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 10.0) -> Event:
        """The first recorded event matching `predicate`, waiting for it if need be (the
        timeout is wall time: a bound on the test, not part of the scenario)."""
        async with asyncio.timeout(timeout):
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if predicate(event):
                        return event
                seen = len(self.events)
                self._new_event.clear()
                await self._new_event.wait()
