"""What a transport gives a session to send output through.

A handful of methods, nothing else to override. `audio` may wait (backpressure from a
bounded playout buffer); `event` and `clear` never block. `played_ms` is the playback
cursor: the total milliseconds of assistant audio actually played out since the sink was
created. The session reads it to truncate an interrupted answer to what was heard.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from .events import Event


class OutputSink(Protocol):
    async def audio(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        """Queue assistant audio for playout; waits while the playout buffer is full."""
        ...

    def event(self, event: Event) -> None:
        """Deliver a server event; must not block (queue it, bounded)."""
        ...

    def clear(self) -> None:
        """Drop all queued, unplayed audio at once (barge-in)."""
        ...

    def pause(self) -> None:
        """Hold playback at once, keeping what is queued (the user may be interrupting)."""
        ...

    def resume(self) -> None:
        """Go on playing after a pause (it was not an interruption, or it was cleared)."""
        ...

    @property
    def played_ms(self) -> int: ...

    async def drained(self) -> None:
        """Return once every queued frame has been played (or cleared)."""
        ...


class DetachedSink:
    """The sink of a session whose client is gone for now (it may resume): output goes
    nowhere, and the event log keeps what happened for the client to replay."""

    async def audio(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        return None

    def event(self, event: Event) -> None:
        return None

    def clear(self) -> None:
        return None

    def pause(self) -> None:
        return None

    def resume(self) -> None:
        return None

    @property
    def played_ms(self) -> int:
        return 0

    async def drained(self) -> None:
        return None
