"""Function calling, response options and item operations, performed through the client
event dispatcher on a real Session (real Redis, the fake engine, a clocked sink)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from realtime.openai.dispatch import ClientEventDispatcher
from realtime.openai.ga_events import GAExpander
from realtime.openai.server_events import to_wire
from sessions.clock import ScaledClock
from sessions.events import (
    ConversationItemCreated,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    InputAudioTimeoutTriggered,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    ResponseCreated,
    ResponseDone,
)
from sessions.manager import SessionManager
from sessions.session import Session
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink

from .conftest import MakeSession

CLOCK = ScaledClock(8.0)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}


def msg(**fields: Any) -> str:
    return json.dumps(fields)


async def start(
    make_session: MakeSession, config: dict[str, Any] | None = None
) -> tuple[ClientEventDispatcher, Session, ClockedSink]:
    session, sink = await make_session({"turn_detection": None, **(config or {})})
    return ClientEventDispatcher(session, transport="websocket"), session, sink


def errors(sink: ClockedSink) -> list[ErrorEvent]:
    return sink.of(ErrorEvent)


async def wait_done(sink: ClockedSink, n: int) -> ResponseDone:
    await sink.wait_for(lambda _: len(sink.of(ResponseDone)) >= n)
    done: ResponseDone = sink.of(ResponseDone)[n - 1]
    return done


async def test_the_model_calls_a_tool_and_the_answer_uses_its_output(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    d, session, sink = await start(make_session)
    await d.handle_raw(msg(type="session.update", session={"tools": [WEATHER, TIME]}))
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the weather in Paris?"}],
            },
        )
    )
    await d.handle_raw(msg(type="response.create"))
    done = await wait_done(sink, 1)
    assert not errors(sink)
    assert done.status == "completed" and done.item is None  # a call, no words
    (call,) = done.calls
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    assert json.loads(call.arguments) == {"city": "fake"}
    deltas = sink.of(FunctionCallArgumentsDelta)
    assert "".join(d.delta for d in deltas) == call.arguments
    (finished,) = sink.of(FunctionCallArgumentsDone)
    assert finished.item.call_id == call.call_id
    assert engine.requests[0].tools[0].name == "get_weather"
    assert engine.requests[0].tools[0].parameters["required"] == ["city"]
    # The client runs the tool and sends its output; the next answer reads it.
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            item={
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": '{"sky": "sunny", "temperature_c": 21}',
            },
        )
    )
    await d.handle_raw(msg(type="response.create"))
    answer = await wait_done(sink, 2)
    assert answer.item is not None and "sunny" in answer.item.text
    kinds = [(i.kind, i.call_id) for i in engine.requests[1].history]
    assert ("function_call", call.call_id) in kinds
    assert ("function_call_output", call.call_id) in kinds
    assert not errors(sink)
    # Every event of the exchange is GA JSON with the function call in its place.
    expander = GAExpander()
    out: list[dict[str, Any]] = []
    for event in sink.events:
        wire = to_wire(event)
        if wire is not None:
            out += expander.expand(event, wire)
    types = [m["type"] for m in out]
    assert types.count("response.function_call_arguments.done") == 1
    assert "response.output_item.added" in types


async def test_parallel_tool_calls_off_keeps_the_first_of_the_models_two_calls(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """A model that calls both tools at once: with `parallel_tool_calls` on (OpenAI's
    default) the response carries both calls; off, only the first (the second is neither
    announced, nor in response.done, nor in the conversation), and the engine is told."""
    engine.calls = 2
    d, session, sink = await start(make_session)
    await d.handle_raw(msg(type="session.update", session={"tools": [WEATHER, TIME]}))
    await d.handle_raw(msg(type="response.create"))
    both = await wait_done(sink, 1)
    assert [call.name for call in both.calls] == ["get_weather", "get_time"]
    assert engine.requests[0].parallel_tool_calls
    await d.handle_raw(msg(type="session.update", session={"parallel_tool_calls": False}))
    await d.handle_raw(msg(type="response.create"))
    one = await wait_done(sink, 2)
    assert not errors(sink)
    (call,) = one.calls
    assert call.name == "get_weather" and call.status == "completed"
    assert not engine.requests[1].parallel_tool_calls
    second = [e for e in sink.of(FunctionCallArgumentsDone) if e.response_id == one.response_id]
    assert [e.item.call_id for e in second] == [call.call_id]
    announced = [e.item for e in sink.of(ConversationItemCreated) if e.item.type == "function_call"]
    assert [item.name for item in announced] == ["get_weather", "get_time", "get_weather"]
    history = [item.name for item in await session.history.items() if item.name]
    assert history == ["get_weather", "get_time", "get_weather"]


async def test_response_create_options_shape_one_answer(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    d, session, sink = await start(make_session, {"tools": [WEATHER]})
    await d.handle_raw(
        msg(
            type="response.create",
            event_id="evt_r1",
            response={
                "instructions": "Greet the user warmly.",
                "output_modalities": ["text"],
                "tool_choice": "none",
                "max_output_tokens": 3,
                "metadata": {"client_event_id": "c1"},
            },
        )
    )
    done = await wait_done(sink, 1)
    assert not errors(sink)
    request = engine.requests[0]
    assert request.instructions == "Greet the user warmly."
    assert request.output_text_only and request.tool_choice == "none"
    assert request.max_output_tokens == 3
    assert done.item is not None and len(done.item.text.split()) == 3
    assert done.metadata == {"client_event_id": "c1"}
    assert sink.of(ResponseCreated)[0].metadata == {"client_event_id": "c1"}
    # The session's own settings are untouched by one response's options.
    assert session.config.instructions != "Greet the user warmly."


async def test_an_out_of_band_response_leaves_the_conversation_as_it_was(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    d, session, sink = await start(make_session)
    await session.add_text("Tell me a story.")
    before = [item.id for item in await session.history.items()]
    await d.handle_raw(
        msg(
            type="response.create",
            response={
                "conversation": "none",
                "output_modalities": ["text"],
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Classify: happy or sad?"}],
                    }
                ],
            },
        )
    )
    done = await wait_done(sink, 1)
    assert done.status == "completed" and not done.in_conversation
    assert [item.id for item in await session.history.items()] == before
    assert engine.requests[0].text == "Classify: happy or sad?"
    assert engine.requests[0].history == () and engine.requests[0].session_id == ""
    # The pending question is still what the next real answer answers.
    await d.handle_raw(msg(type="response.create"))
    await wait_done(sink, 2)
    assert engine.requests[1].text == "Tell me a story."


async def test_client_item_ids_previous_item_id_retrieve_and_delete(
    make_session: MakeSession,
) -> None:
    d, session, sink = await start(make_session)

    def user(item_id: str, text: str, **extra: Any) -> str:
        item: dict[str, Any] = {"id": item_id, "type": "message", "role": "user"}
        item["content"] = [{"type": "input_text", "text": text}]
        return msg(type="conversation.item.create", item=item, **extra)

    await d.handle_raw(user("msg_001", "first"))
    await d.handle_raw(user("msg_003", "third"))
    await d.handle_raw(user("msg_002", "second", previous_item_id="msg_001"))
    await d.handle_raw(user("msg_000", "zeroth", previous_item_id="root"))
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            item={
                "id": "msg_a",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "An answer I gave before."}],
            },
        )
    )
    assert not errors(sink)
    ids = [item.id for item in await session.history.items()]
    assert ids == ["msg_000", "msg_001", "msg_002", "msg_003", "msg_a"]
    created = sink.of(ConversationItemCreated)
    assert [(e.item.id, e.previous_item_id) for e in created][2] == ("msg_002", "msg_001")
    await d.handle_raw(msg(type="conversation.item.retrieve", item_id="msg_002"))
    (retrieved,) = sink.of(ConversationItemRetrieved)
    assert retrieved.item.text == "second"
    await d.handle_raw(msg(type="conversation.item.delete", item_id="msg_002"))
    assert "msg_002" not in [item.id for item in await session.history.items()]
    bad = [
        user("msg_001", "again", event_id="e_dup"),
        user("msg_009", "where?", event_id="e_prev", previous_item_id="msg_nope"),
        msg(type="conversation.item.retrieve", item_id="msg_002", event_id="e_get"),
        msg(type="conversation.item.delete", item_id="msg_002", event_id="e_del"),
    ]
    for raw in bad:
        await d.handle_raw(raw)
    assert [(e.client_event_id, e.code) for e in errors(sink)] == [
        ("e_dup", "invalid_value"),
        ("e_prev", "invalid_value"),
        ("e_get", "item_retrieve_invalid_item_id"),
        ("e_del", "item_delete_invalid_item_id"),
    ]
    # Nothing of the refused items got in.
    assert "msg_009" not in [item.id for item in await session.history.items()]


async def test_an_input_audio_item_is_a_turn_the_next_answer_hears(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    d, _, sink = await start(make_session)
    pcm = (np.sin(np.arange(24_000) / 10) * 3000).astype(np.int16)  # 1 s at 24 kHz
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_audio", "audio": base64.b64encode(pcm.tobytes()).decode()}
                ],
            },
        )
    )
    (created,) = sink.of(ConversationItemCreated)
    assert created.item.has_audio and created.item.audio_ms == 1000
    await d.handle_raw(msg(type="response.create"))
    await wait_done(sink, 1)
    assert len(engine.requests[0].audio) == 16_000  # the item's second, at 16 kHz
    assert not errors(sink)


async def test_a_second_response_create_is_openais_active_response_error(
    make_session: MakeSession,
) -> None:
    d, _, sink = await start(make_session)
    await d.handle_raw(msg(type="response.create"))
    await d.handle_raw(msg(type="response.create", event_id="e2"))
    (error,) = errors(sink)
    assert (error.client_event_id, error.code) == ("e2", "conversation_already_has_active_response")
    await d.handle_raw(msg(type="input_audio_buffer.commit", event_id="e3"))
    assert errors(sink)[-1].code == "input_audio_buffer_commit_empty"


async def test_idle_timeout_turns_a_silence_after_an_answer_into_a_turn(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.audio_ms = 200
    d, session, sink = await start(make_session)
    await d.handle_raw(
        msg(
            type="session.update",
            session={
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 2000}}
                }
            },
        )
    )
    await session.add_text("Hello?")
    await d.handle_raw(msg(type="response.create"))
    await wait_done(sink, 1)
    silence = np.zeros(320, dtype=np.int16).tobytes()
    for _ in range(200):  # 4 s of silence at 20 ms, at microphone pace on the test clock
        await session.append_audio(silence, 16_000, 1)
        await CLOCK.sleep(0.02)
        if sink.of(InputAudioTimeoutTriggered):
            break
    (timeout,) = sink.of(InputAudioTimeoutTriggered)
    assert timeout.audio_end_ms > timeout.audio_start_ms
    await wait_done(sink, 2)  # and the silence was answered
    assert len(engine.requests[1].audio) > 0


async def test_a_turn_no_answer_follows_is_transcribed_all_the_same(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    d, session, sink = await start(make_session)
    tone = (np.sin(np.arange(8_000) / 5) * 3000).astype(np.int16)  # 0.5 s at 16 kHz
    await session.append_audio(tone.tobytes(), 16_000, 1)
    await d.handle_raw(msg(type="input_audio_buffer.commit"))
    done = await sink.wait_for(lambda e: isinstance(e, InputTranscriptionCompleted))
    assert isinstance(done, InputTranscriptionCompleted) and done.transcript == "heard 500 ms"
    assert [e.delta for e in sink.of(InputTranscriptionDelta)] == ["heard 500 ms"]
    (item,) = await session.history.items()
    assert item.text == "heard 500 ms"
    assert not sink.of(ResponseCreated)  # nothing answered it
    # Answered later, the turn is not announced again.
    await d.handle_raw(msg(type="response.create"))
    await wait_done(sink, 1)
    assert len(sink.of(InputTranscriptionCompleted)) == 1


async def test_response_create_right_after_response_done_queues_its_audio_after(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """After response.done the answer may still be playing (its last audio, in the sink): a
    new response.create is no error; the new answer's audio follows the old."""
    engine.audio_ms, engine.realtime_factor = 1_000, 50.0
    d, session, sink = await start(make_session)
    await session.add_text("Hello!")
    await d.handle_raw(msg(type="response.create"))
    first = await wait_done(sink, 1)
    assert sink.playout.queued_ms > 0  # still playing when response.done went out
    await session.add_text("And the capital of France?")
    await d.handle_raw(msg(type="response.create", event_id="e_next"))
    second = await wait_done(sink, 2)
    assert not errors(sink)
    assert first.status == second.status == "completed"
    items = await session.history.items()
    first_answer = next(item for item in items if first.item and item.id == first.item.id)
    assert first_answer.status == "completed"  # handed over, not truncated


async def test_the_clients_truncation_stands_after_a_barge_in(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """An OpenAI client truncates the answer to what it played as soon as speech starts;
    the server's own cut on the barge-in that follows must not lengthen it again."""
    engine.audio_ms, engine.realtime_factor = 3_000, 2.0
    d, session, sink = await start(make_session)
    await session.add_text("Tell me a story.")
    await d.handle_raw(msg(type="response.create"))
    await sink.wait_for(lambda e: e.type == "response.output_audio.delta")
    await CLOCK.sleep(0.5)
    item_id = sink.of(ConversationItemCreated)[-1].item.id
    await d.handle_raw(
        msg(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=40)
    )
    await d.handle_raw(msg(type="response.cancel"))
    done = await wait_done(sink, 1)
    assert done.status == "cancelled"
    cuts = [e.audio_end_ms for e in sink.of(ConversationItemTruncated)]
    assert cuts and set(cuts) == {40}, cuts
    (answer,) = [item for item in await session.history.items() if item.role == "assistant"]
    assert answer.audio_ms == 40 and answer.status == "incomplete"


async def test_session_created_comes_first_even_for_an_update_sent_at_once(
    manager: SessionManager,
) -> None:
    async with ClockedSink(clock=manager.clock) as sink:
        session = await manager.create(sink, {"turn_detection": None})
        await session.update({"instructions": "Be brief."})  # before run() has started
        assert sink.types()[:2] == ["session.created", "session.updated"]
        await session.close()


async def test_an_earlier_answer_can_be_truncated_too(make_session: MakeSession) -> None:
    d, session, sink = await start(make_session)
    await d.handle_raw(
        msg(
            type="conversation.item.create",
            item={
                "id": "msg_old",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_audio", "transcript": "one two three four"}],
            },
        )
    )
    item = await session.history.get("msg_old")
    assert item is not None and item.has_audio
    item.audio_ms = 2000  # as if it had been spoken
    await session.history.update(item)
    await d.handle_raw(
        msg(
            type="conversation.item.truncate", item_id="msg_old", content_index=0, audio_end_ms=1000
        )
    )
    assert not errors(sink)
    cut = await session.history.get("msg_old")
    assert cut is not None and (cut.text, cut.audio_ms) == ("one two", 1000)
    assert sink.of(ConversationItemTruncated)[-1].audio_end_ms == 1000
