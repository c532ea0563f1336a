"""GPT-Live's Responses delegation, with Parley's own model as the Responses backend.

In GPT-Live a session with `delegation: {type: "responses", responses: {tools: [...]}}`
hands work needing tools to a Responses backend; the client sees the backend's stream as
`response.event` envelopes (each a Responses streaming event, tagged with the delegation's
id), answers each function call with a `response.item.create` carrying a
`function_call_output`, then asks the backend to go on with one `response.create`. What the
backend then says reaches the user through the live model's voice.

Parley has one model for both parts: its Thinker, with its tool-constrained decoding, is
the backend. A response of the session in which the model calls functions becomes a
delegation: `session.delegation.created` (target `responses`, the response's id), then
`response.created`, one `response.output_item.done` per call (a completed `function_call`
item) and `response.completed`, nested. The client's outputs join the conversation as
function call outputs and its `response.create` starts the answer that uses them, spoken as
any other; that answer's own `response.created` / `response.completed` go out nested under
the same delegation.
"""

from __future__ import annotations

from typing import Any

from sessions.events import (
    ConversationItem,
    Event,
    FunctionCallArgumentsDone,
    ResponseCreated,
    ResponseDone,
    new_id,
)

from ..transports.websocket.sender import Message

MAX_OPEN_CALLS = 64
"""Function calls waiting for their outputs; past this the oldest are forgotten."""


class ResponsesBackend:
    """Which session response belongs to which delegation, and the calls still open."""

    def __init__(self) -> None:
        self._delegation_of: dict[str, str] = {}
        """Parley response id -> the delegation it serves."""
        self._open_calls: dict[str, str] = {}
        """call id -> delegation id, until the client sends the call's output."""
        self._answered: str | None = None
        """The delegation whose output came in last, since the last `response.create`."""
        self._continuing: str | None = None
        """The delegation the client's `response.create` continues, until its response starts."""

    def messages(self, event: Event, offset_ms: int) -> list[Message]:
        """What a session event means on the wire (nothing for most events)."""
        if isinstance(event, ResponseCreated):
            delegation = self._continuing
            if delegation is None:
                return []
            self._continuing = None
            self._delegation_of[event.response_id] = delegation
            return [envelope(delegation, "response.created", response(event.response_id))]
        if isinstance(event, FunctionCallArgumentsDone):
            out: list[Message] = []
            delegation = self._delegation_of.get(event.response_id)
            if delegation is None:
                delegation = new_id("deleg")
                self._delegation_of[event.response_id] = delegation
                out.append(created(delegation, event.response_id, offset_ms))
                out.append(envelope(delegation, "response.created", response(event.response_id)))
            self._open_calls[event.item.call_id] = delegation
            while len(self._open_calls) > MAX_OPEN_CALLS:
                del self._open_calls[next(iter(self._open_calls))]
            item = call_item(event.item)
            out.append(envelope(delegation, "response.output_item.done", {"item": item}))
            return out
        if isinstance(event, ResponseDone):
            delegation = self._delegation_of.pop(event.response_id, None)
            if delegation is None:
                return []
            status = "completed" if event.status == "completed" else "incomplete"
            body = response(event.response_id, status)
            if status == "incomplete":
                body["incomplete_details"] = {"reason": event.reason or event.status}
            return [envelope(delegation, f"response.{status}", body)]
        return []

    def output(self, call_id: str) -> str | None:
        """The delegation a function call's output answers (None: no such call is open)."""
        delegation = self._open_calls.pop(call_id, None)
        if delegation is not None:
            self._answered = delegation
        return delegation

    def waiting(self) -> int:
        """Function calls still without their outputs (a `response.create` then is refused,
        as GPT-Live refuses a partial batch)."""
        return len(self._open_calls)

    def continue_work(self) -> str | None:
        """The delegation a `response.create` goes on with: the one whose outputs came in
        last (None: no output arrived since the last `response.create`)."""
        delegation, self._answered = self._answered, None
        if delegation is not None:
            self._continuing = delegation
        return delegation

    def forget_continuation(self) -> None:
        """The `response.create` did not start a response (the session refused it)."""
        self._continuing = None


def response(response_id: str, status: str = "in_progress") -> dict[str, Any]:
    """A Responses lifecycle snapshot, reduced as GPT-Live sends them (no input, no output)."""
    return {"response": {"id": response_id, "object": "response", "status": status, "output": []}}


def envelope(delegation_id: str, kind: str, body: dict[str, Any]) -> Message:
    return {
        "type": "response.event",
        "event_id": new_id("event"),
        "delegation_id": delegation_id,
        "event": {"type": kind, **body},
    }


def created(delegation_id: str, response_id: str, offset_ms: int) -> Message:
    return {
        "type": "session.delegation.created",
        "event_id": new_id("event"),
        "offset_ms": offset_ms,
        "delegation": {
            "id": delegation_id,
            "type": "delegation",
            "target": "responses",
            "response_id": response_id,
        },
    }


def call_item(item: ConversationItem) -> dict[str, Any]:
    return {
        "id": item.id,
        "type": "function_call",
        "status": "completed",
        "call_id": item.call_id,
        "name": item.name,
        "arguments": item.arguments,
    }
