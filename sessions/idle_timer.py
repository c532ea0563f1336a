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

from pipeline.tasks import TaskSet

from .clock import Clock


class IdleTimer:
    def __init__(self, clock: Clock, name: str) -> None:
        self._clock = clock
        self._waiting: asyncio.Task[None] | None = None
        self._tasks = TaskSet(f"{name}:idle")
        """Owns the pending timeout, a disarmed one until it has ended and the one firing;
        `close()` closes it."""

    @property
    def armed(self) -> bool:
        return self._waiting is not None and not self._waiting.done()

    def arm(self, seconds: float, fire: Callable[[], Awaitable[None]]) -> None:
        """Call `fire` after `seconds` unless disarmed first (a closed timer: never)."""
        self.disarm()
        if not self._tasks.closed:
            self._waiting = self._tasks.create_task(
                self._wait(seconds, fire), name=self._tasks.name
            )

    def disarm(self) -> None:
        """Drop the pending timeout, if any (a timeout already firing runs to its end)."""
        if self._waiting is not None and self._waiting is not asyncio.current_task():
            self._waiting.cancel()
        self._waiting = None

    async def _wait(self, seconds: float, fire: Callable[[], Awaitable[None]]) -> None:
        await self._clock.sleep(seconds)
        # From here on this is the firing task: a disarm by what `fire` starts (a new
        # answer) must not cancel it halfway.
        self._waiting = None
        await fire()

    async def close(self) -> None:
        """Cancel and await the timer's tasks. Idempotent."""
        self._waiting = None
        await self._tasks.close()  # not the calling task, if it is the one firing
