"""Calls that ring while the app decides: accept (with a session), reject, or refer.

OpenAI's SIP flow answers a call only when the app says so over HTTP
(`POST /v1/realtime/calls/{call_id}/accept|reject|refer`), and the app may say so before
its webhook handler has even returned. So a call is registered here *before* its webhook
goes out (`open`), the route's decision lands on it whenever it comes (`resolve`), and the
SIP side waits for it (`wait`) under a deadline: a call nobody decides on is turned away
with 480 (Temporarily Unavailable) rather than ringing for ever.

The registry is bounded (`limit` calls ringing at once; `open` refuses the next with
TooManyPendingCalls, a 503 for the caller), holds each call only while someone waits on it,
and starts no task: a decision is a future the waiter awaits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sessions import SessionConfig

from ...live.live_config import LiveSessionConfig
from .handler import Rejection

DEFAULT_LIMIT = 64
DECISION_DEADLINE_S = 30.0
"""How long a call rings while the app decides (OpenAI's callers hear about as long)."""

REASONS = {
    302: "Moved Temporarily",
    404: "Not Found",
    480: "Temporarily Unavailable",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    500: "Server Internal Error",
    503: "Service Unavailable",
    600: "Busy Everywhere",
    603: "Decline",
    604: "Does Not Exist Anywhere",
}
"""Reason phrases (RFC 3261 section 21) for the statuses apps send most; others get a class's."""
CLASS_REASONS = {3: "Redirection", 4: "Request Failure", 5: "Server Failure", 6: "Decline"}


def reason_phrase(status: int) -> str:
    return REASONS.get(status) or CLASS_REASONS.get(status // 100, "Decline")


@dataclass(frozen=True, slots=True)
class Accept:
    """Answer the call with this session; attach to it as `call_id` (`?call_id=`, or a
    GPT-Live sideband on the session of that id)."""

    call_id: str
    config: SessionConfig
    live: LiveSessionConfig | None = None
    """A GPT-Live app's session configuration: the call is a GPT-Live session (its events
    are Live's, its controllers Live sidebands), not a Realtime one."""


@dataclass(frozen=True, slots=True)
class Reject:
    """Turn the call away with this final status (300-699; the app's default is 603)."""

    status: int = 603
    detail: str = ""
    """Why, for logs (the app's reject, no decision in time, the caller gone...)."""

    def rejection(self) -> Rejection:
        return Rejection(self.status, reason_phrase(self.status))


@dataclass(frozen=True, slots=True)
class Refer:
    """Send the caller elsewhere: an unanswered call is redirected (a 302 whose Contact is
    `target_uri`), as SIP redirects a call that was never answered."""

    target_uri: str


Decision = Accept | Reject | Refer


def describe(decision: Decision) -> str:
    """For logs: what was decided, without the session's instructions or tools."""
    if isinstance(decision, Accept):
        return "accept"
    if isinstance(decision, Reject):
        return f"reject {decision.status} ({decision.detail})" if decision.detail else "reject"
    return f"refer to {decision.target_uri}"


class TooManyPendingCalls(RuntimeError):
    pass


class PendingCalls:
    def __init__(self, limit: int = DEFAULT_LIMIT, deadline_s: float = DECISION_DEADLINE_S) -> None:
        self.limit = limit
        self.deadline_s = deadline_s
        self._calls: dict[str, asyncio.Future[Decision]] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, call_id: object) -> bool:
        """Whether `call_id` still waits for a decision."""
        future = self._calls.get(call_id) if isinstance(call_id, str) else None
        return future is not None and not future.done()

    def open(self, call_id: str) -> None:
        """Register `call_id` as waiting for a decision (before its webhook goes out); the
        SIP side then `wait`s for it, which ends its registration."""
        if call_id in self._calls:
            raise ValueError(f"call {call_id} is already waiting for a decision")
        if len(self._calls) >= self.limit:
            raise TooManyPendingCalls(f"{self.limit} calls are already waiting for a decision")
        self._calls[call_id] = asyncio.get_running_loop().create_future()

    def resolve(self, call_id: str, decision: Decision) -> bool:
        """Decide on `call_id`: False if it is not waiting (unknown, decided, or gone). The
        decision is kept for `wait`, however soon it comes."""
        future = self._calls.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(decision)
        return True

    async def wait(self, call_id: str, deadline_s: float | None = None) -> Decision:
        """The decision on an opened call; Reject(480) if none comes within `deadline_s`
        (the registry's deadline by default). The call is no longer pending afterwards,
        however this ends (a cancelled waiter included). KeyError for a call not opened."""
        future = self._calls.get(call_id)
        if future is None:
            raise KeyError(f"call {call_id} is not waiting for a decision")
        try:
            async with asyncio.timeout(self.deadline_s if deadline_s is None else deadline_s):
                return await future
        except TimeoutError:
            if future.done() and not future.cancelled():  # decided as the deadline passed
                return future.result()
            return Reject(480, "no decision in time")
        finally:
            if self._calls.get(call_id) is future:
                del self._calls[call_id]
            future.cancel()
