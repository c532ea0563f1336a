"""How many audio requests a server process runs at once, and what it does past that.

Whisper and Piper run on the same two cores as the sessions' own models; an unbounded
number of uploads would starve live calls. Each endpoint holds a small number of slots;
a request that finds them all taken is refused at once with OpenAI's 429 (clients retry
with backoff, as they do against OpenAI) rather than queued, so a burst cannot build a
backlog that outlives the clients waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from .errors import AudioApiError

RETRY_AFTER_S = 1


class Admission:
    """`slots` requests at once for one endpoint; the rest get a 429."""

    def __init__(self, what: str, slots: int) -> None:
        if slots < 1:
            raise ValueError("an endpoint needs at least one slot")
        self.what = what
        self.slots = slots
        self._free = asyncio.Semaphore(slots)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the body of the `async with`; AudioApiError(429) when none is free."""
        if self._free.locked():
            raise AudioApiError(
                429,
                f"this server runs {self.slots} {self.what} request(s) at a time and all are "
                "busy; retry shortly",
                code="rate_limit_exceeded",
                kind="rate_limit_error",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        async with self._free:
            yield
