"""A budget for the `error` events one connection earns with its own bad messages.

A client may send a burst of malformed messages faster than any `error` reply can go out:
one reply each would fill the connection's bounded outbound queue (and close a client that
is reading, as too slow) and, on the OpenAI endpoint, push the session's whole resume log
out of its bounded Redis stream. So each connection sends at most `limit` such errors per
`window_s`; the rest are counted, and one summary error says how many were left out (and
what the first of them was) when the window ends, or sooner if a new one starts first.
Every bad message is accounted for: the errors sent plus the counts in the summaries.

The summary is due at the end of the window even if the client goes quiet, so the
throttle schedules it with a timer on the event loop (a callback, not a task: nothing to
await); `close()` cancels it. The owner decides how a summary is worded and sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

DEFAULT_LIMIT = 20
"""Error events about the client's own messages per window; the rest are summarised."""
DEFAULT_WINDOW_S = 1.0

Summarise = Callable[[int, str], None]
"""`(how many errors were left out, the first of them as "code: message")`."""


class ErrorThrottle:
    def __init__(
        self,
        summarise: Summarise,
        *,
        limit: int = DEFAULT_LIMIT,
        window_s: float = DEFAULT_WINDOW_S,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.suppressed_total = 0
        """Errors left out over the connection's life (each also in some summary)."""
        self._summarise = summarise
        self._window_end = -1.0
        self._sent = 0
        self._suppressed = 0
        self._first = ""
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def admit(self, code: str, message: str) -> bool:
        """Whether to send this error now; False: it is counted for the next summary."""
        if self._closed:
            return False
        now = asyncio.get_running_loop().time()
        if now >= self._window_end:
            self._flush()  # the timer has not run yet (a busy loop): keep the order
            self._window_end = now + self.window_s
            self._sent = 0
        if self._sent < self.limit:
            self._sent += 1
            return True
        if not self._suppressed:
            self._first = f"{code}: {message}"
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(self._window_end, self._flush)
        self._suppressed += 1
        self.suppressed_total += 1
        return False

    def close(self) -> None:
        """No more summaries (the connection is ending). Idempotent."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._suppressed or self._closed:
            return
        count, first = self._suppressed, self._first
        self._suppressed, self._first = 0, ""
        self._summarise(count, first)


def summary_text(count: int, first: str, limit: int, window_s: float) -> str:
    """The people's text of a summary error, the same on every endpoint."""
    per = "a second" if window_s == 1.0 else f"per {window_s:g} s"
    return (
        f"{count} more errors about your messages were not sent (at most {limit} error "
        f"events {per} per connection); the first of them was {first}"
    )
