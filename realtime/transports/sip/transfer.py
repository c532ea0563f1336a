"""Transferring an answered call (RFC 3515, the "blind" transfer of RFC 5589): what the
REFER we send carries, and what the caller's NOTIFYs say of it.

OpenAI's `POST /v1/realtime/calls/{id}/refer` (and GPT-Live's `.../sessions/{id}/refer`)
moves an active call elsewhere with a REFER in its dialog: the caller's side (a PBX, a
carrier's trunk, a phone) accepts it with a 202, calls the target itself, and reports how
that goes in NOTIFYs whose bodies are SIP fragments (`message/sipfrag`, RFC 3420): "SIP/2.0
100 Trying", then the target's final status. A 2xx there means the caller is now talking to
the target, and Parley leaves the call (a BYE); any other final status means the transfer
failed and the call goes on with the model.
"""

from __future__ import annotations

import re

from .message import Message

REFER_EVENT = "refer"
SIPFRAG = re.compile(rb"^\s*SIP/2\.0\s+(\d{3})\b")


def refer_headers(target_uri: str, contact: str) -> tuple[tuple[str, str], ...]:
    """A REFER's own headers: where to go, who asks (our Contact), and our Contact (a REFER
    sets up the subscription its NOTIFYs belong to, so it must say where we are)."""
    return (("Refer-To", f"<{target_uri}>"), ("Referred-By", contact), ("Contact", contact))


def is_refer_notify(request: Message) -> bool:
    """A NOTIFY of the `refer` event package (its `Event` header, parameters aside)."""
    event = (request.get("Event") or "").split(";")[0].strip()
    return event.lower() == REFER_EVENT


def reported_status(request: Message) -> int | None:
    """The status a refer NOTIFY reports (its sipfrag's status line), None if it has none."""
    match = SIPFRAG.match(request.body)
    return int(match.group(1)) if match else None


def subscription_over(request: Message) -> bool:
    """The NOTIFY ends the subscription (`Subscription-State: terminated`)."""
    state = (request.get("Subscription-State") or "").split(";")[0].strip()
    return state.lower() == "terminated"
