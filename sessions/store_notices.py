"""What a session's client is told when the session store cannot take its writes.

Three notices, each an `error` event at most once per episode (one outage of Redis, or one
refusal of writes by a Redis at its memory limit; redis_link.py): Redis is unreachable,
Redis is full, and (only if it happens) writes kept on this server were dropped because
the session's spill passed its bound (spill.py). The conversation goes on through all of
them; the messages say what is kept, what is lost and what no longer works meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import RedisFullError, RedisUnavailableError, RedisWritesDroppedError
from .events import ErrorEvent
from .redis_link import RedisLink

_WHAT = {
    "audio": "input audio",
    "frames": "video frames",
    "events": "events of the resume log",
    "history": "conversation items",
    "record": "session record updates",
}


class StoreNotices:
    def __init__(
        self,
        link: RedisLink,
        spill_max_bytes: int,
        emit: Callable[[ErrorEvent], None] | None = None,
        closing: Callable[[], bool] = lambda: False,
    ) -> None:
        """`emit`: how `tell` tells the client; `closing()`: the session ends (nothing more
        is told)."""
        self._link = link
        self._emit = emit
        self._closing = closing
        self._mib = spill_max_bytes / (1024 * 1024)
        self._outage = 0
        """The number of the last outage the client was told of."""
        self._refusal = 0
        """The number of the last refusal the client was told of."""
        self._loss: tuple[int, int] = (0, 0)
        """The episode (outage, refusal numbers) whose dropped writes the client was told of."""

    def outage(self, outage: int) -> ErrorEvent | None:
        """The notice of outage number `outage`, or None if it was given already."""
        if outage <= self._outage:
            return None
        self._outage = outage
        return _notice(
            RedisUnavailableError,
            "The session store (Redis) is unreachable. The conversation goes on: new audio, "
            f"items and events are kept on this server (up to {self._mib:g} MiB) and stored "
            "when it is back. Until then a dropped connection cannot be resumed, and a turn "
            "whose audio was stored before the outage cannot be answered.",
        )

    def refusal(self, refusal: int) -> ErrorEvent | None:
        """The notice of refusal number `refusal`, or None if it was given already."""
        if refusal <= self._refusal:
            return None
        self._refusal = refusal
        return _notice(
            RedisFullError,
            "The session store (Redis) is full (out of memory) and refuses new writes. The "
            "conversation goes on: new audio, items and events are kept on this server (up "
            f"to {self._mib:g} MiB) and stored once it accepts writes again. Until then a "
            "dropped connection cannot be resumed with what was said since.",
        )

    def dropped(self, kind: str) -> ErrorEvent | None:
        """The notice that kept writes (first of `kind`) were dropped, once an episode."""
        episode = (self._link.outages, self._link.refusals)
        if episode == self._loss:
            return None
        self._loss = episode
        store = "is still unreachable" if not self._link.up else "still refuses writes"
        return _notice(
            RedisWritesDroppedError,
            f"The session store (Redis) {store}, and this session's writes kept on "
            f"this server reached their {self._mib:g} MiB bound: the oldest are being "
            f"dropped and will never be stored, media first (now: {_WHAT.get(kind, kind)}), "
            "events and conversation items last. The conversation goes on.",
        )

    def tell(self, notice: ErrorEvent | None) -> None:
        """Send `notice` to the client, unless it was given already or the session ends."""
        if notice is not None and self._emit is not None and not self._closing():
            self._emit(notice)

    def trouble(self) -> None:
        """A call failed for want of the session store: the client hears why, once."""
        link = self._link
        full = link.up and link.refusing
        self.tell(self.refusal(link.refusals) if full else self.outage(link.outages))

    def spill_dropped(self, kind: str, count: int) -> None:
        """The spill gave up kept writes: the client hears of it once an episode."""
        self.tell(self.dropped(kind))


def _notice(error: type[RedisUnavailableError], message: str) -> ErrorEvent:
    return ErrorEvent(code=error.code, error_type=error.error_type, message=message)
