"""The GA sequence around the session's events, and the replay of a log after an id."""

from __future__ import annotations

from typing import Any

from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from realtime.openai.client_events import AudioFormats
from realtime.openai.ga_events import GAExpander, source_id
from realtime.openai.resume import Replay, replay_messages
from realtime.openai.server_events import to_wire
from realtime.openai.websocket import ga_messages
from sessions import events as ev
from sessions.config import SessionConfig
from sessions.events import ConversationItem, Event
from sessions.records import event_to_dict

FORMATS = AudioFormats()


def replay_after(
    bodies: list[dict[str, Any]], expander: GAExpander, formats: AudioFormats, last: str | None
) -> Replay:
    """What an OpenAI client missed after `last`, through the connection's own mapping."""
    return replay_messages(
        bodies, lambda e: [m for m, _ in ga_messages(e, expander, formats)], last
    )


def a_turn() -> list[Event]:
    """What the session emits for one spoken question and a full answer."""
    user = ConversationItem(id="item_u", role="user", has_audio=True, audio_ms=900)
    answer = ConversationItem(id="item_a", role="assistant", status="in_progress", has_audio=True)
    done = ConversationItem(
        id="item_a", role="assistant", text="Hi there.", has_audio=True, audio_ms=700
    )
    return [
        ev.SessionCreated(session_id="sess_1", config=SessionConfig(), resume_token="tok"),
        ev.AudioBufferCommitted(item_id="item_u", previous_item_id=None),
        ev.ConversationItemCreated(item=user, previous_item_id=None),
        ev.ResponseCreated(response_id="resp_1"),
        ev.ConversationItemCreated(item=answer, previous_item_id="item_u", response_id="resp_1"),
        ev.OutputAudioTranscriptDelta(response_id="resp_1", item_id="item_a", delta="Hi "),
        ev.OutputAudioTranscriptDelta(response_id="resp_1", item_id="item_a", delta="there."),
        ev.ResponseDone(response_id="resp_1", status="completed", item=done),
    ]


def expand(expander: GAExpander, events: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in events:
        wire = to_wire(event, formats=FORMATS)
        assert wire is not None
        out.extend(expander.expand(event, wire))
    return out


def test_a_response_gets_the_complete_ga_sequence() -> None:
    messages = expand(GAExpander(), a_turn())
    assert [m["type"] for m in messages] == [
        "session.created",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    by_type = {m["type"]: m for m in messages}
    assert by_type["response.output_audio_transcript.done"]["transcript"] == "Hi there."
    assert by_type["response.content_part.done"]["part"] == {
        "type": "audio",
        "transcript": "Hi there.",
    }
    assert by_type["response.output_item.added"]["item"]["status"] == "in_progress"
    assert by_type["response.output_item.done"]["item"]["status"] == "completed"
    ids = [m["event_id"] for m in messages]
    assert len(set(ids)) == len(ids)


def a_function_call() -> list[Event]:
    """A response that says a few words, then calls a tool."""
    said = ConversationItem(id="item_t", role="assistant", status="in_progress")
    call = ConversationItem(
        id="item_c",
        role="assistant",
        type="function_call",
        status="in_progress",
        name="get_weather",
        call_id="call_1",
    )
    done = ConversationItem(
        id="item_c",
        role="assistant",
        type="function_call",
        name="get_weather",
        call_id="call_1",
        arguments='{"city": "Paris"}',
    )
    return [
        ev.ResponseCreated(response_id="resp_2", audio_output=False),
        ev.ConversationItemCreated(item=said, previous_item_id=None, response_id="resp_2"),
        ev.OutputTextDelta(response_id="resp_2", item_id="item_t", delta="Let me check."),
        ev.ConversationItemCreated(item=call, previous_item_id="item_t", response_id="resp_2"),
        ev.FunctionCallArgumentsDelta(
            response_id="resp_2", item_id="item_c", call_id="call_1", delta='{"city": '
        ),
        ev.FunctionCallArgumentsDelta(
            response_id="resp_2", item_id="item_c", call_id="call_1", delta='"Paris"}'
        ),
        ev.FunctionCallArgumentsDone(response_id="resp_2", item=done),
        ev.ResponseDone(
            response_id="resp_2",
            status="completed",
            item=ConversationItem(id="item_t", role="assistant", text="Let me check."),
            calls=(done,),
            audio_output=False,
        ),
    ]


def test_a_function_call_is_an_output_item_of_its_own() -> None:
    messages = expand(GAExpander(), a_function_call())
    assert [m["type"] for m in messages] == [
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    call_events = [m for m in messages if m["type"].startswith("response.function_call")]
    assert {m["output_index"] for m in call_events} == {1}
    assert call_events[-1]["arguments"] == '{"city": "Paris"}'
    assert call_events[-1]["name"] == "get_weather" and call_events[-1]["call_id"] == "call_1"
    for message in messages:  # each as the openai SDK declares it
        assert TypeAdapter(RealtimeServerEvent).validate_python(message).type == message["type"]
    output = messages[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["message", "function_call"]
    assert output[1]["arguments"] == '{"city": "Paris"}'
    ids = [m["event_id"] for m in messages]
    assert len(set(ids)) == len(ids)


def test_an_out_of_band_response_joins_no_conversation() -> None:
    events = a_function_call()
    events[0] = ev.ResponseCreated(response_id="resp_2", audio_output=False, in_conversation=False)
    messages = expand(GAExpander(), events)
    types = [m["type"] for m in messages]
    assert "conversation.item.added" not in types and "conversation.item.done" not in types
    assert messages[0]["response"]["conversation_id"] is None


def test_ids_are_deterministic_so_a_replay_repeats_them() -> None:
    events = a_turn()
    first = expand(GAExpander(), events)
    again = expand(GAExpander(), events)
    assert [m["event_id"] for m in first] == [m["event_id"] for m in again]
    assert {source_id(m["event_id"]) for m in first} == {e.event_id for e in events}


def test_beta_clients_get_beta_names() -> None:
    types = [m["type"] for m in expand(GAExpander(beta=True), a_turn())]
    assert "response.audio_transcript.delta" in types
    assert "response.audio.done" in types
    assert "conversation.item.created" in types
    assert "conversation.item.added" not in types and "conversation.item.done" not in types


def test_replay_after_any_id_the_client_saw_sends_the_rest_exactly_once() -> None:
    events = a_turn()
    bodies = [event_to_dict(e) for e in events]
    live = expand(GAExpander(), events)
    live_ids = [m["event_id"] for m in live]
    for cut, last in enumerate(live_ids):
        replay = replay_after(bodies, GAExpander(), FORMATS, last)
        assert replay.found
        assert [m["event_id"] for m in replay.missed] == live_ids[cut + 1 :]
    # An audio delta is named after the event sent before it.
    replay = replay_after(bodies, GAExpander(), FORMATS, f"{live_ids[8]}~3")
    assert [m["event_id"] for m in replay.missed] == live_ids[9:]
    everything = replay_after(bodies, GAExpander(), FORMATS, None)
    assert [m["event_id"] for m in everything.missed] == live_ids


def test_an_id_no_longer_in_the_log_replays_everything_and_says_so() -> None:
    bodies = [event_to_dict(e) for e in a_turn()]
    replay = replay_after(bodies, GAExpander(), FORMATS, "evt_trimmed_long_ago")
    assert not replay.found
    assert len(replay.missed) == len(expand(GAExpander(), a_turn()))
