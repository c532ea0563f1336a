"""OpenAI's SIP flow for one incoming call: the webhook out, the app's decision back.

What the SIP side calls from `CallHandler.invite` when `--sip-webhook` is set:
`decision = await gate.decide(call)`, then Accept -> answer the offer with a session made
from `decision.config` (registered as `decision.call_id`, the id the app was given, so
`?call_id=` and `/hangup` find it); Reject -> `decision.rejection()`; Refer -> a 302 to
`decision.target_uri`. When the caller goes away first (CANCEL), either cancel the task
that awaits `decide` or call `gate.withdraw(call.call_id)`: the call stops being pending
(a late accept gets 404) and `decide` returns Reject(487).

The app sees OpenAI's ids: a fresh `rtc_...` call id, not the SIP Call-ID (which is the
caller's, may hold any characters, and does not belong in a URL path). A gate for GPT-Live
(`api="live"`) sends `live.transport.incoming` instead, naming a fresh `live_...` session
id, which the app's decision (`/v1/live/sessions/{session_id}/accept|reject|refer`) and,
once accepted, the session itself carry.

The app's id is named in the call index (realtime/call_index.py) before the webhook goes
out (`announce`), so a decision landing on another worker process (`--workers N`) finds
this one at once, however soon after the webhook it comes (web/call_controls.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pipeline.tasks import TaskSet
from sessions.events import new_id

from .handler import IncomingCall
from .pending_calls import Decision, PendingCalls, Reject, TooManyPendingCalls, describe
from .webhook import WebhookError, WebhookSender, incoming_call_event, live_incoming_event

log = logging.getLogger("parley.realtime.sip.gate")


SipApi = Literal["realtime", "live"]
"""Which OpenAI API a deployment's SIP calls are for (`--sip-api`)."""
Announce = Callable[[str], Awaitable[None]]
"""Say where the call of this app id is (the call index's `add`); never raises."""


class WebhookCallGate:
    def __init__(
        self,
        sender: WebhookSender,
        pending: PendingCalls,
        api: SipApi = "realtime",
        announce: Announce | None = None,
    ) -> None:
        self.sender = sender
        self.pending = pending
        self.api = api
        self.announce = announce
        """Awaited with the app's id before its webhook goes out."""
        self._ids: dict[str, str] = {}
        """SIP Call-ID -> the call id the app was given, while the call is pending (until
        `decide` returns, so the id is among `app_ids` until the answer takes it over)."""

    def app_ids(self) -> set[str]:
        """The app's ids of the calls being decided."""
        return set(self._ids.values())

    def call_id_of(self, sip_call_id: str) -> str | None:
        """The app's id for a pending SIP call (None when it is not pending)."""
        return self._ids.get(sip_call_id)

    async def decide(self, call: IncomingCall) -> Decision:
        """Send the webhook for `call` and wait for the app's decision (Reject(480) if the
        webhook cannot be delivered or no decision comes in time; Reject(503) when too
        many calls are pending already)."""
        if call.call_id in self._ids:
            return Reject(482, "a call with this Call-ID is already pending")
        call_id = new_id("live" if self.api == "live" else "rtc")
        try:
            self.pending.open(call_id)
        except TooManyPendingCalls as exc:
            log.warning("SIP call %s turned away: %s", call.call_id, exc)
            return Reject(503, str(exc))
        self._ids[call.call_id] = call_id
        make_event = live_incoming_event if self.api == "live" else incoming_call_event
        event = make_event(call_id, call.headers)
        # The decision may come while the webhook is in flight (apps often accept from
        # inside their webhook handler), so delivery runs beside the wait, in a task this
        # call owns and ends before returning.
        try:
            async with TaskSet(f"{call_id}:webhook") as delivering:
                delivering.create_task(self._deliver(call_id, event), name=delivering.name)
                decision = await self.pending.wait(call_id)
        finally:
            self._ids.pop(call.call_id, None)
        log.info("SIP call %s (%s): %s", call.call_id, call_id, describe(decision))
        return decision

    def withdraw(self, sip_call_id: str) -> bool:
        """The caller has gone (CANCEL) before a decision: `decide` returns Reject(487).
        False if the call was not pending."""
        call_id = self._ids.get(sip_call_id)
        if call_id is None:
            return False
        return self.pending.resolve(call_id, Reject(487, "the caller cancelled"))

    async def _deliver(self, call_id: str, event: dict[str, Any]) -> None:
        if self.announce is not None:  # before the app can know the id
            await self.announce(call_id)
        try:
            await self.sender.send(event)
        except WebhookError as exc:
            log.warning("call %s: %s", call_id, exc)
            self.pending.resolve(call_id, Reject(480, str(exc)))
