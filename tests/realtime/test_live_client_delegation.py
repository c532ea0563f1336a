"""Client delegation's bookkeeping (realtime/live/live_client_delegation.py) and the Live
mapping's transcripts, without a transport: a delegating call is announced once, answered
once as its call's output, acknowledged when due unless the app spoke first; a
transcript is never said twice."""

from __future__ import annotations

import asyncio
from typing import Any

from realtime.live.live_client_delegation import DELEGATE, ClientDelegations
from realtime.live.live_config import parse_live_config
from realtime.live.live_protocol import LiveProtocol
from sessions import ResponseOptions
from sessions.events import (
    ConversationItem,
    ConversationItemCreated,
    FunctionCallArgumentsDone,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    ResponseDone,
)


def delegate(call_id: str, name: str = DELEGATE) -> FunctionCallArgumentsDone:
    item = ConversationItem(
        role="assistant", type="function_call", name=name, call_id=call_id, arguments="{}"
    )
    return FunctionCallArgumentsDone(response_id="resp_1", item=item)


class Speaker:
    """What the delegations use of a session: its responses, recorded."""

    closed = False
    session_id = "sess_test"

    def __init__(self) -> None:
        self.asked: list[ResponseOptions] = []

    async def create_response(self, options: ResponseOptions | None = None) -> str:
        assert options is not None
        self.asked.append(options)
        return "resp_ack"


async def test_a_delegating_call_is_announced_answered_once_and_acknowledged() -> None:
    delegations = ClientDelegations()
    speaker = Speaker()
    delegations.session = speaker  # type: ignore[assignment]
    assert delegations.messages(delegate("call_x", name="get_weather"), 10) == []
    (created,) = delegations.messages(delegate("call_1"), 1234)
    assert created["type"] == "session.delegation.created" and created["offset_ms"] == 1234
    delegation_id = created["delegation"]["id"]
    assert created["delegation"] == {"id": delegation_id, "target": "client", "type": "delegation"}
    assert delegations.known(delegation_id) and not delegations.known("deleg_other")
    delegations.messages(ResponseDone(response_id="resp_1", status="completed"), 1300)
    runner = asyncio.create_task(delegations.run())
    try:
        async with asyncio.timeout(5):
            while not speaker.asked:
                await asyncio.sleep(0.01)
    finally:
        runner.cancel()
    (ack,) = speaker.asked
    assert ack.tool_choice == "none" and not ack.in_conversation  # said, not acted on
    assert delegations.answer(delegation_id) == "call_1"  # the first answer: the output
    assert delegations.answer(delegation_id) is None  # later ones are notes
    assert delegations.known(delegation_id)  # and the app may go on answering it


async def test_the_delegation_is_told_as_its_call_starts_and_answered_once_the_call_is_done() -> (
    None
):
    """The call's item comes before its arguments (a small model writes them for ~1 s):
    the delegation is told then, once; an answer before the call is done is a note, the
    first one after it is the call's output."""
    delegations = ClientDelegations()
    item = ConversationItem(
        role="assistant", type="function_call", name=DELEGATE, call_id="call_2", arguments=""
    )
    started = ConversationItemCreated(item=item, previous_item_id=None, response_id="resp_1")
    (created,) = delegations.messages(started, 900)
    assert created["type"] == "session.delegation.created" and created["offset_ms"] == 900
    delegation_id = created["delegation"]["id"]
    assert delegations.answer(delegation_id) is None  # the call is still being written
    assert delegations.messages(delegate("call_2"), 1900) == []  # told once
    assert delegations.answer(delegation_id) == "call_2"
    assert delegations.answer(delegation_id) is None


async def test_an_append_before_the_acknowledgement_is_due_cancels_it() -> None:
    delegations = ClientDelegations()
    delegations.delay_ms = 200
    speaker = Speaker()
    delegations.session = speaker  # type: ignore[assignment]
    runner = asyncio.create_task(delegations.run())
    try:
        delegations.messages(delegate("call_1"), 0)
        delegations.messages(ResponseDone(response_id="resp_1", status="completed"), 0)
        await asyncio.sleep(0.05)
        delegations.appended()  # the app's commentary came first
        await asyncio.sleep(0.4)
    finally:
        runner.cancel()
    assert speaker.asked == []


def test_a_transcript_is_said_once_however_often_it_is_recognised() -> None:
    live = parse_live_config({"model": "gpt-live-1"})
    protocol = LiveProtocol(live, send=None, close=lambda reason: None)
    said: list[Any] = []
    for event in (
        InputTranscriptionDelta(item_id="item_1", delta="What is "),
        InputTranscriptionCompleted(item_id="item_1", transcript="What is the time?"),
        InputTranscriptionCompleted(item_id="item_1", transcript="What is the time?"),
        InputTranscriptionDelta(item_id="item_1", delta="What"),
    ):
        said += [m["delta"] for m, _ in protocol.messages(event)]
    assert "".join(said) == "What is the time?"
