"""`idle_timeout_ms`: after an answer has played, a silence this long becomes a turn.

OpenAI's server VAD can prompt a quiet caller: once the last answer's audio has played, if
no speech starts within the timeout, the silent audio is committed as a user turn
(`input_audio_buffer.timeout_triggered`) and answered. The timer is one pending timeout at
a time: arming it again replaces the old one, speech or any new answer disarms it. Its
owner (the session) closes it, which cancels and awaits whatever is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pipeline.tasks import cancel_and_wait

from .clock import Clock


class IdleTimer:
    def __init__(self, clock: Clock, name: str) -> None:
        self._clock = clock
        self._name = name
        self._waiting: asyncio.Task[None] | None = None
        self._firing: asyncio.Task[None] | None = None

    @property
    def armed(self) -> bool:
        return self._waiting is not None and not self._waiting.done()

    def arm(self, seconds: float, fire: Callable[[], Awaitable[None]]) -> None:
        """Call `fire` after `seconds` unless disarmed first."""
        self.disarm()
        loop = asyncio.get_running_loop()
        self._waiting = loop.create_task(self._wait(seconds, fire), name=f"{self._name}:idle")

    def disarm(self) -> None:
        """Drop the pending timeout, if any (a timeout already firing runs to its end)."""
        if self._waiting is not None and self._waiting is not asyncio.current_task():
            self._waiting.cancel()
        self._waiting = None

    async def _wait(self, seconds: float, fire: Callable[[], Awaitable[None]]) -> None:
        await self._clock.sleep(seconds)
        # From here on this is the firing task: a disarm by what `fire` starts (a new
        # answer) must not cancel it halfway.
        self._waiting, self._firing = None, asyncio.current_task()
        await fire()

    async def close(self) -> None:
        """Cancel and await the timer's tasks. Idempotent."""
        waiting, firing = self._waiting, self._firing
        self._waiting = self._firing = None
        for task in (waiting, firing):
            if task is not None and task is not asyncio.current_task():
                await cancel_and_wait(task)
