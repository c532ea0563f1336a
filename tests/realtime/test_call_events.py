"""A call's server events (realtime.openai.call_events) without a peer connection: the GA
sequence on a stand-in data channel, the playout news only with a response id, listeners
fed and told once when the call ends."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from realtime.openai.call_events import MAX_CHANNEL_BUFFER, CallEvents
from sessions import events as ev
from sessions.config import SessionConfig
from sessions.events import ConversationItem, Event

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
USER = ConversationItem(id="item_u", role="user", has_audio=True, audio_ms=1500)
ANSWER = ConversationItem(id="item_a", role="assistant", has_audio=True, audio_ms=700)


class Channel:
    """What CallEvents uses of an RTCDataChannel."""

    def __init__(self, state: str = "open") -> None:
        self.readyState = state
        self.bufferedAmount = 0
        self.sent: list[dict[str, Any]] = []
        self.handlers: dict[str, Any] = {}

    def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    def on(self, name: str, handler: Any) -> None:
        self.handlers[name] = handler


class Listener:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.posted: list[dict[str, Any]] = []
        self.ended: list[str] = []

    def event(self, event: Event) -> None:
        self.events.append(event)

    def post(self, message: dict[str, Any], *, after_audio: bool = False) -> None:
        self.posted.append(message)

    def call_ended(self, reason: str) -> None:
        self.ended.append(reason)


def opened() -> tuple[CallEvents, Channel]:
    events, channel = CallEvents(), Channel()
    events.open(channel)  # type: ignore[arg-type]
    return events, channel


def test_a_turn_goes_out_as_the_ga_sequence_with_transcription_usage() -> None:
    events, channel = opened()
    turn: list[Event] = [
        ev.SessionCreated(session_id="sess_1", config=SessionConfig(), resume_token="tok"),
        ev.ConversationItemCreated(item=USER, previous_item_id=None),
        ev.InputTranscriptionCompleted(item_id="item_u", transcript="hello"),
        ev.ResponseCreated(response_id="resp_1"),
        ev.ConversationItemCreated(item=ANSWER, previous_item_id="item_u", response_id="resp_1"),
        ev.OutputAudioTranscriptDelta(response_id="resp_1", item_id="item_a", delta="Hi"),
        ev.OutputAudioDelta(
            response_id="resp_1", item_id="item_a", pcm=b"\0\0", sample_rate=24_000
        ),
        ev.ResponseDone(response_id="resp_1", status="completed", item=ANSWER),
    ]
    for event in turn:
        events.session_event(event, extra_events=False)
    assert [m["type"] for m in channel.sent] == [
        "session.created",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    transcribed = channel.sent[3]
    assert transcribed["usage"] == {"type": "duration", "seconds": 1.5}
    for message in channel.sent:
        SERVER_EVENT.validate_python(message)


def test_playout_news_waits_for_a_response_id() -> None:
    events, channel = opened()
    events.playout("started")  # audio with no response behind it: no id to give
    assert channel.sent == []
    events.session_event(ev.ResponseCreated(response_id="resp_1"), extra_events=False)
    events.playout("started")
    events.playout("cleared")
    news = [m for m in channel.sent if m["type"].startswith("output_audio_buffer.")]
    assert [m["response_id"] for m in news] == ["resp_1", "resp_1"]
    for message in news:
        SERVER_EVENT.validate_python(message)


def test_messages_wait_for_the_channel_to_open() -> None:
    events, channel = CallEvents(), Channel("connecting")
    events.session_event(ev.ResponseCreated(response_id="resp_1"), extra_events=False)
    events.open(channel)  # type: ignore[arg-type]
    assert channel.sent == []
    channel.readyState = "open"
    channel.handlers["open"]()
    assert [m["type"] for m in channel.sent] == ["response.created", "rate_limits.updated"]


def test_listeners_get_the_events_and_the_end_once() -> None:
    events, _ = opened()
    listener, gone = Listener(), Listener()
    assert events.listen(listener) and events.listen(gone)
    events.unlisten(gone)
    created = ev.ResponseCreated(response_id="resp_1")
    events.session_event(created, extra_events=False)
    events.playout("started")
    assert listener.events == [created]
    assert [m["type"] for m in listener.posted] == ["output_audio_buffer.started"]
    events.end("hangup")
    events.end("again")
    assert listener.ended == ["hangup"] and gone.ended == []
    assert not events.listen(Listener())  # too late: the call has ended


class Broken(Listener):
    def event(self, event: Event) -> None:
        raise RuntimeError("a bug in a listener")


def test_a_failing_listener_is_detached_and_the_call_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events, channel = opened()
    broken, fine = Broken(), Listener()
    events.listen(broken)
    events.listen(fine)
    created = ev.ResponseCreated(response_id="resp_1")
    with caplog.at_level(logging.ERROR, "parley.realtime.webrtc"):
        events.session_event(created, extra_events=False)
    assert "listener failed" in caplog.text
    assert broken.ended == ["server_error"] and events.listeners == 1
    assert fine.events == [created]
    assert [m["type"] for m in channel.sent] == ["response.created", "rate_limits.updated"]


def test_a_backlog_that_does_not_go_down_is_a_stall_and_one_that_drains_is_not() -> None:
    events, channel = opened()
    assert events.stalled_s(0.0) == 0.0  # nothing unsent
    channel.bufferedAmount = 1_000
    assert events.stalled_s(1.0) == 0.0  # a backlog starts
    channel.bufferedAmount = 5_000  # more queued, none sent
    assert events.stalled_s(3.0) == 2.0
    channel.bufferedAmount = 4_000  # some went out: the peer reads
    assert events.stalled_s(4.0) == 0.0
    assert events.stalled_s(4.5) == 0.5
    channel.bufferedAmount = 0
    assert events.stalled_s(9.0) == 0.0
    channel.bufferedAmount, channel.readyState = 9_000, "closed"
    assert events.stalled_s(20.0) == 0.0


def test_a_channel_that_is_not_read_costs_at_most_its_bound() -> None:
    events, channel = opened()
    channel.bufferedAmount = MAX_CHANNEL_BUFFER + 1  # the peer stopped reading
    updated = ev.SessionUpdated(session_id="sess_1", config=SessionConfig())
    for _ in range(100):
        events.session_event(updated, extra_events=False)
    assert channel.sent == [] and events.dropped == 100
