"""Typed errors of the session core.

Each carries a stable `code` that transports turn into an HTTP status or an `error`
event, and a message written for the person at the other end.
"""

from __future__ import annotations


class ParleyError(Exception):
    """Base class: `code` is machine-readable, `str(err)` is for people."""

    code = "server_error"
    error_type = "server_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(ParleyError):
    """The client sent something we cannot use; the session is unaffected.

    `code` overrides the class's code where OpenAI's protocol has a specific one
    (`conversation_already_has_active_response`, `input_audio_buffer_commit_empty`, ...).
    """

    code = "invalid_request"
    error_type = "invalid_request_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ConfigError(InvalidRequestError):
    """A setting is out of range or of the wrong type. Nothing was changed."""

    code = "invalid_config"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class MediaError(InvalidRequestError):
    """Audio or an image that cannot be used as sent. Nothing already buffered is lost."""

    code = "invalid_media"


class SessionLimitError(ParleyError):
    """Every session slot is taken; try again later."""

    code = "session_limit"
    error_type = "server_error"


class KeyLimitError(SessionLimitError):
    """The caller's key has as many sessions as it may hold at once, or has started them
    faster than it may (sessions/key_limits.py); other keys still get in. An HTTP 429.
    `retry_after_s`: when a rate-limited caller may try again (None for the concurrency
    limit: a slot frees when one of its sessions ends)."""

    code = "rate_limit_exceeded"
    error_type = "rate_limit_error"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SessionClosedError(InvalidRequestError):
    """The session has ended; it takes no more media or commands."""

    code = "session_closed"


class SessionExpiredError(InvalidRequestError):
    """The session ended by one of its limits; `codes` maps the close reason to the error's
    code (OpenAI's own for the maximum duration)."""

    code = "session_expired"
    codes = {"max_duration": "session_expired", "idle_timeout": "session_idle_timeout"}


class SessionNotFoundError(InvalidRequestError):
    """No live session has this id."""

    code = "session_not_found"


class RedisUnavailableError(ParleyError, ConnectionError):
    """The session store (Redis) cannot be reached right now; the session goes on.

    A ConnectionError too, so code that already treats an unreachable Redis as an OSError
    (the resume path) handles it the same way."""

    code = "redis_unavailable"
    error_type = "server_error"


class RedisFullError(RedisUnavailableError):
    """The session store (Redis) answers but refuses writes: it is at its memory limit
    (`maxmemory` with the `noeviction` policy). Reads still work; writes are kept locally
    and written once it accepts them again, as in an outage."""

    code = "redis_full"


class RedisWritesDroppedError(RedisUnavailableError):
    """Writes kept locally while the session store could not take them passed the
    session's bound: the oldest were dropped and will never be stored."""

    code = "redis_writes_dropped"
