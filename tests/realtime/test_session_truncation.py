"""OpenAI's session `truncation` through the client event dispatcher on a real Session (real
Redis, the fake engine): set by session.update and echoed in session.updated as given,
bad values refused naming the field, handed to the engine with each request; a response
the engine fails with context_length_exceeded is a failed response.done with that code,
and the conversation in Redis is left as it was."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.types import Truncation
from realtime.openai.dispatch import ClientEventDispatcher
from realtime.openai.server_events import to_wire
from sessions.clock import ScaledClock
from sessions.events import ErrorEvent, ResponseDone, SessionUpdated
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink

from .conftest import MakeSession

CLOCK = ScaledClock(8.0)
RATIO = {
    "type": "retention_ratio",
    "retention_ratio": 0.8,
    "token_limits": {"post_instructions": 2000},
}


def msg(**fields: Any) -> str:
    return json.dumps(fields)


def updated(sink: ClockedSink) -> dict[str, Any]:
    wire = to_wire(sink.of(SessionUpdated)[-1])
    assert wire is not None
    session: dict[str, Any] = wire["session"]
    return session


async def test_truncation_is_echoed_and_reaches_the_engine(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    session, sink = await make_session({"turn_detection": None})
    d = ClientEventDispatcher(session, transport="websocket")
    await d.handle_raw(msg(type="session.update", session={"truncation": RATIO}))
    await sink.wait_for(lambda e: isinstance(e, SessionUpdated))
    assert updated(sink)["truncation"] == RATIO
    await session.add_text("Hello.")
    await d.handle_raw(msg(type="response.create"))
    await sink.wait_for(lambda _: bool(sink.of(ResponseDone)))
    assert engine.requests[-1].truncation == Truncation("retention_ratio", 0.8, 2000)

    await d.handle_raw(msg(type="session.update", session={"truncation": "disabled"}))
    await sink.wait_for(lambda _: len(sink.of(SessionUpdated)) >= 2)
    assert updated(sink)["truncation"] == "disabled"
    assert not sink.of(ErrorEvent)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("never", "'auto', 'disabled' or a retention_ratio object"),
        ({"type": "retention_ratio", "retention_ratio": 1.5}, "between 0 and 1"),
        ({"type": "retention_ratio"}, "retention_ratio must be a number"),
        ({"type": "sliding"}, "type must be 'retention_ratio'"),
        (
            {
                "type": "retention_ratio",
                "retention_ratio": 0.5,
                "token_limits": {"post_instructions": 0},
            },
            "post_instructions",
        ),
        (7, "retention_ratio object"),
    ],
)
async def test_a_bad_truncation_is_refused_naming_the_field(
    make_session: MakeSession, value: object, words: str
) -> None:
    session, sink = await make_session({"turn_detection": None})
    d = ClientEventDispatcher(session, transport="websocket")
    await d.handle_raw(
        msg(type="session.update", session={"truncation": value, "instructions": "Be brief."})
    )
    await sink.wait_for(lambda e: isinstance(e, ErrorEvent))
    error = sink.of(ErrorEvent)[0]
    assert error.error_type == "invalid_request_error"
    assert "truncation" in f"{error.param} {error.message}" and words in error.message
    assert session.config.truncation == "auto"  # the rest of the update applies
    await sink.wait_for(lambda e: isinstance(e, SessionUpdated))
    assert session.config.instructions == "Be brief."


async def test_context_length_exceeded_fails_the_response_with_that_code(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.fail_with = "the conversation needs 9000 tokens, more than 8192"
    engine.fail_code = "context_length_exceeded"
    session, sink = await make_session({"turn_detection": None, "truncation": "disabled"})
    d = ClientEventDispatcher(session, transport="websocket")
    await session.add_text("Hello.")
    before = [item.id for item in await session.history.items()]
    await d.handle_raw(msg(type="response.create"))
    await sink.wait_for(lambda _: bool(sink.of(ResponseDone)))
    done = to_wire(sink.of(ResponseDone)[0])
    assert done is not None
    response = done["response"]
    assert response["status"] == "failed"
    error = response["status_details"]["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "9000 tokens" in error["message"]
    assert [item.id for item in await session.history.items()] == before
    (told,) = sink.of(ErrorEvent)  # the error event before it says the same
    assert (told.code, told.error_type) == ("context_length_exceeded", "invalid_request_error")
