"""GPT-Live's client delegation, with Parley's own model deciding when to delegate.

In GPT-Live a session with `delegation: {type: "client"}` hands work it cannot do in the
conversation (a lookup, an action, deeper reasoning) to the application: the server sends
`session.delegation.created` (an id and the place on the timeline; no task text, as the
application reads the conversation itself), the model says a short acknowledgement, and the
application answers whenever it is done with appends that carry the delegation's id:
`session.commentary.append` (to be said), `session.thinking.append` (silent context),
`session.instructions.append`. Further appends with the same id continue that work.

Parley's Thinker decides by its tool-constrained decoding: a client-delegation session
offers it one function, `DELEGATE_TOOL`, whose call is the delegation. Its one argument,
the request in a few words, stays in the conversation only (GPT-Live's event carries no
task text; the app reads the conversation): it grounds the model's later relay of the
answer (without it SmolLM2 answered the result with "you're right, I'll be more
accurate"). The app's first commentary under the delegation's id is that call's output in
the conversation, so the model relays it as it relays any tool's result (the path a small
model follows best); later ones are notes to say, as any commentary. The acknowledgement
is a response of its own, with no tools and kept out of the history, asked for
`acknowledgement_delay_ms` after the delegating answer has ended (0 by default, as
GPT-Live's for non-Decisions sessions); any commentary or thinking appended meanwhile
cancels every pending one (GPT-Live's rule).

A session whose delegation is omitted is a client delegation in GPT-Live's terms too, but
Parley's model answers everything itself there: it delegates only when the session asks
for `client` delegation explicitly, so an app that never handles delegations is never left
with work nobody does. `run()` is a task of the host's, for the session's life.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import Any

from sessions import ResponseOptions, Session
from sessions.errors import InvalidRequestError
from sessions.events import (
    ConversationItemCreated,
    Event,
    FunctionCallArgumentsDone,
    ResponseCreated,
    ResponseDone,
    new_id,
)

from ..transports.websocket.sender import Message

log = logging.getLogger("parley.realtime.live")

DELEGATE = "look_it_up"
DELEGATE_TOOL: dict[str, Any] = {
    "type": "function",
    "name": DELEGATE,
    "description": (
        "Hand the user's request to the application when it needs something beyond this "
        "conversation: looking up information, checking current data, or acting for the "
        "user. The application does the work and its result follows."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "request": {"type": "string", "description": "What the user wants, in a few words."}
        },
        "required": ["request"],
        "additionalProperties": False,
    },
}

ACKNOWLEDGE = (
    "A colleague is looking up the answer to the user's last question for you. Tell the "
    "user in one short sentence that you are checking and will be right back. Do not "
    "answer the question yourself."
)
"""The acknowledgement's own context: the model repeats the words. A small model asked to
say it in its own words greeted the user instead ("I'm ready to assist you")."""


MAX_OPEN = 64
"""Delegations an app may still answer; past this the oldest are forgotten."""


class ClientDelegations:
    def __init__(self) -> None:
        self.session: Session | None = None
        self.delay_ms = 0
        self._open: collections.OrderedDict[str, str | None] = collections.OrderedDict()
        """Delegation id -> its call's id, until the app's first answer is that call's output."""
        self._calls: collections.OrderedDict[str, bool] = collections.OrderedDict()
        """Call id of a delegating call -> whether its arguments are done (only then can an
        answer be its output: an earlier one is a note to say)."""
        self._acknowledge: float | None = None
        """When the pending acknowledgement is due (loop time), None when none is."""
        self._generating = False
        self._wake = asyncio.Event()

    def known(self, delegation_id: str) -> bool:
        return delegation_id in self._open

    def answer(self, delegation_id: str) -> str | None:
        """The delegation's call id, the first time the app answers it; else None."""
        call_id = self._open.get(delegation_id)
        if call_id is None or not self._calls.get(call_id, False):
            return None
        self._open[delegation_id] = None
        return call_id

    def messages(self, event: Event, offset_ms: int) -> list[Message]:
        """`session.delegation.created` for a delegating call; nothing for anything else."""
        if isinstance(event, ResponseCreated):
            self._generating = True
        elif isinstance(event, ResponseDone):
            self._generating = False
            self._wake.set()
        elif isinstance(event, ConversationItemCreated) and event.item.name == DELEGATE:
            if event.item.type == "function_call" and event.item.call_id:
                return self._created(event.item.call_id, offset_ms)
        elif isinstance(event, FunctionCallArgumentsDone) and event.item.name == DELEGATE:
            started = event.item.call_id in self._calls
            self._calls[event.item.call_id] = True
            if not started:  # no call item was seen first: the delegation starts now
                return self._created(event.item.call_id, offset_ms)
        return []

    def _created(self, call_id: str, offset_ms: int) -> list[Message]:
        """`session.delegation.created` as the delegating call starts, not once its
        arguments are written (~1 s of a small model's decoding): a client that ends the
        caller's turn a while after their last words (LiveKit's, 0.8 s) still has the turn's
        words when the delegation comes."""
        delegation_id = new_id("deleg")
        self._open[delegation_id] = call_id
        self._calls.setdefault(call_id, False)
        while len(self._open) > MAX_OPEN:
            self._open.popitem(last=False)
        while len(self._calls) > MAX_OPEN:
            self._calls.popitem(last=False)
        loop = asyncio.get_running_loop()
        self._acknowledge = loop.time() + self.delay_ms / 1000
        self._wake.set()
        delegation = {"id": delegation_id, "target": "client", "type": "delegation"}
        return [
            {
                "type": "session.delegation.created",
                "event_id": new_id("event"),
                "delegation": delegation,
                "offset_ms": offset_ms,
            }
        ]

    def appended(self) -> None:
        """Commentary or thinking came: every pending acknowledgement is dropped."""
        self._acknowledge = None

    async def run(self) -> None:
        """Say the acknowledgements when they are due; until cancelled by the host."""
        loop = asyncio.get_running_loop()
        while True:
            due = self._acknowledge
            timeout = None if due is None else max(0.0, due - loop.time())
            with contextlib.suppress(TimeoutError):  # an acknowledgement is due
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            session = self.session
            if session is None or session.closed:
                continue
            due = self._acknowledge
            if due is None or self._generating or due > loop.time():
                continue
            self._acknowledge = None
            try:
                options = ResponseOptions(
                    instructions=ACKNOWLEDGE,
                    tool_choice="none",
                    in_conversation=False,
                )
                await session.create_response(options)
            except InvalidRequestError as exc:  # an answer began meanwhile: it speaks for it
                log.debug("session %s: no acknowledgement: %s", session.session_id, exc)
