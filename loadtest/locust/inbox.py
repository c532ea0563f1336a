"""Server events as they arrive, each stamped on the client's monotonic clock, with waits.

Every user keeps one reader task filling an `Inbox`; the scenario waits for the event it
needs (`wait`) without missing one that came in while it was busy elsewhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Match = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class Stamped:
    at: float
    event: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.event.get("type", ""))


class Inbox:
    def __init__(self) -> None:
        self.events: list[Stamped] = []
        self._new = asyncio.Event()

    def put(self, at: float, event: dict[str, Any]) -> None:
        self.events.append(Stamped(at, event))
        self._new.set()

    def mark(self) -> int:
        """A position: `wait(..., after=mark)` only looks at events from here on."""
        return len(self.events)

    async def wait(self, match: Match, after: int = 0, within_s: float = 30.0) -> Stamped:
        async with asyncio.timeout(within_s):
            seen = after
            while True:
                for stamped in self.events[seen:]:
                    if match(stamped.event):
                        return stamped
                seen = len(self.events)
                self._new.clear()
                await self._new.wait()

    async def wait_type(self, kind: str, after: int = 0, within_s: float = 30.0) -> Stamped:
        return await self.wait(lambda e: e.get("type") == kind, after, within_s)

    def position(self, stamped: Stamped) -> int:
        """Where `stamped` (an event returned by `wait`) sits: a mark just before it."""
        for index in range(len(self.events) - 1, -1, -1):
            if self.events[index] is stamped:
                return index
        raise ValueError("not an event of this inbox")

    def since(self, after: int, kind: str) -> list[Stamped]:
        return [s for s in self.events[after:] if s.type == kind]
