"""A session's limits, and the watchdog that ends a session at them.

A session ends by itself when nothing happens in it for `idle_timeout_s`, when it reaches
its maximum lifetime (with a `session.expiring` warning before), and when its client has
been gone longer than the detach grace. The watchdog checks these every
`watchdog_interval_s` on the session's `Clock`; the session tells it of activity (a call
from its client, the end of an answer) and of its client leaving and coming back. It runs
as a task of the session's task group, and ends it by asking the session to close.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .clock import Clock
from .errors import SessionExpiredError
from .events import ErrorEvent, Event, SessionExpiring
from .keys import DEFAULT_KEY_TTL_S
from .spill import DEFAULT_MAX_BYTES

IDLE_TIMEOUT = "idle_timeout"
MAX_DURATION = "max_duration"


@dataclass(frozen=True, slots=True)
class SessionLimits:
    idle_timeout_s: float = 60.0
    """Close after this long with nothing from the client and nothing from the assistant:
    no media or command came in, and no answer was generating or playing (the time counts
    from the end of the last answer's playback). 0: never."""
    max_lifetime_s: float = 3600.0
    """The maximum session length (OpenAI's is 60 minutes)."""
    lifetime_warning_s: float = 60.0
    """Send session.expiring this long before the maximum lifetime."""
    chunk_timeout_s: float = 30.0
    """Fail a response when the pipeline sends nothing for this long."""
    key_ttl_s: int = DEFAULT_KEY_TTL_S
    watchdog_interval_s: float = 1.0
    spill_max_bytes: int = DEFAULT_MAX_BYTES
    """Writes kept in memory per session while Redis is unreachable (oldest media dropped
    first past this)."""


class Watchdog:
    def __init__(
        self,
        limits: SessionLimits,
        clock: Clock,
        *,
        responding: Callable[[], bool],
        emit: Callable[[Event], None],
        close: Callable[[str], None],
    ) -> None:
        """`responding()`: an answer is generating or playing (that is no idleness);
        `emit`: tells the client; `close(reason)`: asks the session to end."""
        self._limits = limits
        self._clock = clock
        self._responding = responding
        self._emit = emit
        self._close = close
        self.created = clock.now()
        self._last_activity = self.created
        """When the client last sent something, or the assistant's last answer ended."""
        self._detached_until: float | None = None

    def activity(self) -> None:
        """The client sent something, or an answer ended: idle time counts from now."""
        self._last_activity = self._clock.now()

    def detached(self, grace_s: float) -> None:
        """The client is gone: the session ends unless it comes back within `grace_s`."""
        self._detached_until = self._clock.now() + grace_s

    def attached(self) -> None:
        self._detached_until = None

    async def run(self) -> None:
        """Check the limits until one ends the session."""
        limits = self._limits
        warned = False
        while True:
            await self._clock.sleep(limits.watchdog_interval_s)
            now = self._clock.now()
            age = now - self.created
            if self._detached_until is not None and now >= self._detached_until:
                self._close("client_gone")
                return
            # an answer generating or playing is no idleness (its end stamps the activity)
            quiet_s = now - self._last_activity
            if not self._responding() and 0 < limits.idle_timeout_s <= quiet_s:
                self._expire(
                    IDLE_TIMEOUT, f"nothing was sent or said for {limits.idle_timeout_s:g} s"
                )
                return
            if age >= limits.max_lifetime_s:
                minutes = limits.max_lifetime_s / 60
                self._expire(
                    MAX_DURATION, f"it reached its maximum duration of {minutes:g} minutes"
                )
                return
            if not warned and age >= limits.max_lifetime_s - limits.lifetime_warning_s:
                warned = True
                self._emit(SessionExpiring(seconds_left=round(limits.max_lifetime_s - age)))

    def _expire(self, reason: str, why: str) -> None:
        """The session ends by its own limit: the client is told why in an `error` (the
        event every protocol's client reads; OpenAI sends `session_expired` the same way),
        then the session closes with that reason."""
        self._emit(
            ErrorEvent(
                code=SessionExpiredError.codes[reason],
                error_type=SessionExpiredError.error_type,
                message=f"The session has ended: {why}.",
            )
        )
        self._close(reason)
