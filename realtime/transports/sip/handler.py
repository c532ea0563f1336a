"""The seam between SIP signalling and a call's media: what the user agent server asks.

The signalling side (`uas.py`: messages, transactions, dialogs, auth) knows nothing of
sessions or RTP; the media side (`media_calls.py`: SDP, RTP, the session) knows nothing of
SIP transactions. The user agent server calls a `CallHandler` at each step of a call's life,
and the handler ends a call from its side through the `Hangup` it was given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class IncomingCall:
    call_id: str
    """The SIP Call-ID of the dialog."""
    source: tuple[str, int]
    """Where the INVITE came from (host, port)."""
    sdp: str
    """The INVITE's SDP offer ("" if it had none)."""
    headers: tuple[tuple[str, str], ...] = field(default=())
    """The INVITE's headers as received (name, value), for webhooks and logs."""


@dataclass(frozen=True, slots=True)
class Answer:
    """Accept the offer: a 200 OK with this SDP answer."""

    sdp: str


@dataclass(frozen=True, slots=True)
class Rejection:
    """Refuse: a final response with this status (488 no common codec, 486 busy, 503 full,
    603 declined...)."""

    status: int
    reason: str
    contact: str = ""
    """For a 3xx (a redirect, OpenAI's refer before the answer): where the caller should go,
    a SIP URI sent as the response's Contact; empty otherwise."""


Hangup = Callable[[str], Awaitable[None]]
"""Given to the handler: ends the call `call_id` from Parley's side (a BYE)."""

Transfer = Callable[[str, str], Awaitable[int]]
"""Given to the handler: asks the caller's side of the answered call `call_id` to call
`target_uri` instead (a REFER); returns the REFER's final SIP status (SipServer.refer)."""


class CallHandler(Protocol):
    async def invite(self, call: IncomingCall) -> Answer | Rejection:
        """A new call: answer its offer or refuse it. May take a while (an app accepts it
        through a webhook first); a CANCEL meanwhile calls `ended` and the result is unused."""
        ...

    async def confirmed(self, call_id: str) -> None:
        """The caller's ACK arrived: the call is up."""
        ...

    async def reinvite(self, call_id: str, sdp: str) -> Answer | Rejection:
        """A new offer in an established call (hold, resume, a new address)."""
        ...

    async def ended(self, call_id: str, reason: str) -> None:
        """The call is over (BYE, CANCEL, no ACK, transport gone); called once per call
        that `invite` was called for, whatever happened."""
        ...
