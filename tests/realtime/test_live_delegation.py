"""Responses delegation's bookkeeping: which session response is which delegation, what
goes out nested, and when the client may go on."""

from __future__ import annotations

from realtime.live.live_delegation import ResponsesBackend
from sessions.events import (
    ConversationItem,
    FunctionCallArgumentsDone,
    ResponseCreated,
    ResponseDone,
)


def call(response_id: str, call_id: str) -> FunctionCallArgumentsDone:
    item = ConversationItem(
        role="assistant", type="function_call", name="f", call_id=call_id, arguments="{}"
    )
    return FunctionCallArgumentsDone(response_id=response_id, item=item)


def test_a_response_with_two_calls_is_one_delegation_and_goes_on_when_both_are_answered() -> None:
    backend = ResponsesBackend()
    assert backend.messages(ResponseCreated(response_id="resp_1"), 10) == []  # not yet work
    first = backend.messages(call("resp_1", "c1"), 120)
    assert [m["type"] for m in first] == [
        "session.delegation.created",
        "response.event",
        "response.event",
    ]
    delegation = first[0]["delegation"]
    assert delegation["target"] == "responses" and delegation["response_id"] == "resp_1"
    assert first[0]["offset_ms"] == 120
    assert [m["event"]["type"] for m in first[1:]] == [
        "response.created",
        "response.output_item.done",
    ]
    second = backend.messages(call("resp_1", "c2"), 130)
    assert [m["event"]["type"] for m in second] == ["response.output_item.done"]
    assert {m["delegation_id"] for m in first[1:] + second} == {delegation["id"]}
    (done,) = backend.messages(ResponseDone(response_id="resp_1", status="completed"), 140)
    assert done["event"]["type"] == "response.completed"

    assert backend.output("nope") is None
    assert backend.output("c1") == delegation["id"]
    assert backend.waiting() == 1  # a partial batch: the client may not go on yet
    assert backend.output("c2") == delegation["id"]
    assert backend.waiting() == 0
    assert backend.continue_work() == delegation["id"]
    (again,) = backend.messages(ResponseCreated(response_id="resp_2"), 200)
    assert again["delegation_id"] == delegation["id"]
    assert again["event"]["response"]["id"] == "resp_2"
    (end,) = backend.messages(ResponseDone(response_id="resp_2", status="cancelled"), 300)
    assert end["event"]["type"] == "response.incomplete"
    assert backend.continue_work() is None  # nothing new to go on with


def test_a_response_without_calls_is_no_delegation() -> None:
    backend = ResponsesBackend()
    backend.messages(ResponseCreated(response_id="resp_1"), 0)
    assert backend.messages(ResponseDone(response_id="resp_1", status="completed"), 5) == []
