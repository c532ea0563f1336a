"""Every session event maps to OpenAI Realtime GA JSON with the fields clients read."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from openai.types.realtime import (
    RealtimeAudioInputTurnDetection,
    RealtimeResponse,
    RealtimeServerEvent,
)
from pydantic import TypeAdapter

from pipeline.types import TokenLogprob
from realtime.openai.client_events import AudioFormats
from realtime.openai.ga_events import GAExpander
from realtime.openai.server_events import (
    PARLEY_EVENTS,
    output_audio_buffer_event,
    session_object,
    to_wire,
)
from sessions import events as ev
from sessions import mcp_events as mcp
from sessions.config import SessionConfig
from sessions.events import ConversationItem, Event

CONFIG = SessionConfig()
MCP_CALL = mcp.mcp_call_item("weather", "get_weather", "call_m")
USER_AUDIO = ConversationItem(id="item_u", role="user", has_audio=True, audio_ms=900)
ASSISTANT = ConversationItem(
    id="item_a", role="assistant", text="Hi there", has_audio=True, audio_ms=700
)

CALL = ConversationItem(
    id="item_c",
    role="assistant",
    type="function_call",
    name="get_weather",
    call_id="call_1",
    arguments='{"city": "Paris"}',
)


CAFE = (
    TokenLogprob("caf", -0.25, b"caf"),
    TokenLogprob("\ufffd", -0.5, b"\xc3"),  # half of "é"
    TokenLogprob("\ufffd", -0.125, b"\xa9"),
)
"""A transcript's tokens, one of them part of a character."""


def samples() -> list[Event]:
    """One instance of every event the session emits."""
    return [
        ev.SessionCreated(session_id="sess_1", config=CONFIG, resume_token="tok"),
        ev.SessionUpdated(session_id="sess_1", config=CONFIG),
        ev.SessionStateChanged(previous="listening", state="thinking", reason="response started"),
        ev.SessionExpiring(seconds_left=60),
        ev.SessionClosed(reason="client"),
        ev.SpeechStarted(audio_start_ms=120, item_id="item_u"),
        ev.SpeechStopped(audio_end_ms=1020, item_id="item_u"),
        ev.AudioBufferCommitted(item_id="item_u", previous_item_id=None),
        ev.AudioBufferCleared(),
        ev.DtmfReceived(digit="5", received_at=1_700_000_000),
        ev.ConversationItemCreated(item=USER_AUDIO, previous_item_id="item_0"),
        ev.ConversationItemTruncated(item_id="item_a", audio_end_ms=350),
        ev.ConversationItemDeleted(item_id="item_0"),
        ev.ConversationItemRetrieved(item=USER_AUDIO),
        ev.InputAudioTimeoutTriggered(item_id="item_u", audio_start_ms=500, audio_end_ms=6500),
        ev.InputTranscriptionDelta(item_id="item_u", delta="café", logprobs=CAFE),
        ev.InputTranscriptionFailed(item_id="item_u", message="the recogniser failed"),
        ev.InputTranscriptionCompleted(item_id="item_u", transcript="café", logprobs=CAFE),
        ev.ResponseCreated(response_id="resp_1"),
        ev.FunctionCallArgumentsDelta(
            response_id="resp_1", item_id="item_c", call_id="call_1", delta="{"
        ),
        ev.FunctionCallArgumentsDone(response_id="resp_1", item=CALL),
        ev.OutputTextDelta(response_id="resp_1", item_id="item_a", delta="Hi"),
        ev.OutputAudioTranscriptDelta(response_id="resp_1", item_id="item_a", delta="Hi"),
        ev.OutputAudioDelta(
            response_id="resp_1", item_id="item_a", pcm=b"\x01\x00\x02\x00", sample_rate=24_000
        ),
        ev.ResponseDone(response_id="resp_1", status="completed", item=ASSISTANT, calls=(CALL,)),
        ev.ErrorEvent(code="invalid_config", message="bad", client_event_id="c1", param="voice"),
        mcp.McpListToolsInProgress(item_id="item_l"),
        mcp.McpListToolsCompleted(item_id="item_l"),
        mcp.McpListToolsFailed(item_id="item_l"),
        mcp.McpCallArgumentsDelta(response_id="resp_1", item_id="item_m", delta="{"),
        mcp.McpCallArgumentsDone(response_id="resp_1", item_id="item_m", arguments="{}"),
        mcp.McpCallInProgress(item_id="item_m"),
        mcp.McpCallCompleted(item=MCP_CALL),
        mcp.McpCallFailed(item=MCP_CALL),
    ]


def wire(event: Event, **kwargs: Any) -> dict[str, Any]:
    out = to_wire(event, **{"extra_events": True} | kwargs)
    assert out is not None
    json.dumps(out)  # JSON-ready, no bytes or dataclasses left
    return out


def test_every_session_event_type_is_covered() -> None:
    def subclasses(cls: type[Event]) -> set[type[Event]]:
        return {sub for direct in cls.__subclasses__() for sub in {direct} | subclasses(direct)}

    # By name: dataclass(slots=True) replaces each class, and the originals may linger.
    assert {e.type for e in samples()} == {cls.type for cls in subclasses(Event)}


@pytest.mark.parametrize("event", samples(), ids=lambda e: e.type)
def test_every_event_has_its_id_and_type(event: Event) -> None:
    out = wire(event)
    assert out["type"] == event.type
    assert out["event_id"] == event.event_id


def test_session_created_is_a_ga_session_object_with_parley_extras() -> None:
    event = ev.SessionCreated(session_id="sess_1", config=CONFIG, resume_token="tok")
    session = wire(event)["session"]
    assert session["type"] == "realtime"
    assert session["object"] == "realtime.session"
    assert session["id"] == "sess_1"
    assert session["model"] == "parley"
    assert session["instructions"] == CONFIG.instructions
    assert session["output_modalities"] == ["audio"]
    audio_in, audio_out = session["audio"]["input"], session["audio"]["output"]
    assert audio_in["format"] == {"type": "audio/pcm", "rate": 24_000}
    assert audio_in["turn_detection"] == {
        "type": "server_vad",
        "threshold": 0.5,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 500,
        "create_response": True,
        "interrupt_response": True,
    }
    assert audio_out == {
        "format": {"type": "audio/pcm", "rate": 24_000},
        "voice": "default",
        "speed": 1.0,
    }
    assert session["tools"] == [] and session["tool_choice"] == "auto"
    assert session["max_output_tokens"] == "inf"
    parley = session["parley"]
    assert parley["resume_token"] == "tok"
    assert parley["min_speech_ms"] == 200
    assert parley["video"]["max_frames"] == 50 and parley["video"]["num_frames"] == 4
    assert parley["max_audio_seconds"] == 120


def test_session_updated_shows_manual_turns_formats_and_no_resume_token() -> None:
    config = CONFIG.updated({"turn_detection": None, "output_modalities": ["text"]})
    formats = AudioFormats(input="audio/pcmu", input_rate=8_000, output="audio/pcma")
    event = ev.SessionUpdated(session_id="sess_1", config=config)
    session = wire(event, formats=formats)["session"]
    assert session["audio"]["input"]["turn_detection"] is None
    assert session["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcma"}
    assert session["output_modalities"] == ["text"]
    assert "resume_token" not in session["parley"]
    assert session["parley"]["min_speech_ms"] is None


def test_session_object_before_a_session_exists_has_no_id() -> None:
    session = session_object(SessionConfig(output_sample_rate=16_000))
    assert "id" not in session
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 16_000}


def test_input_audio_buffer_events() -> None:
    started = wire(ev.SpeechStarted(audio_start_ms=120, item_id="item_u"))
    assert (started["audio_start_ms"], started["item_id"]) == (120, "item_u")
    stopped = wire(ev.SpeechStopped(audio_end_ms=1020, item_id="item_u"))
    assert (stopped["audio_end_ms"], stopped["item_id"]) == (1020, "item_u")
    committed = wire(ev.AudioBufferCommitted(item_id="item_u", previous_item_id="item_0"))
    assert (committed["item_id"], committed["previous_item_id"]) == ("item_u", "item_0")
    assert set(wire(ev.AudioBufferCleared())) == {"type", "event_id"}


@pytest.mark.parametrize(
    ("item", "part"),
    [
        (USER_AUDIO, {"type": "input_audio", "transcript": None}),
        (
            ConversationItem(role="user", text="hello", has_audio=True),
            {"type": "input_audio", "transcript": "hello"},
        ),
        (ConversationItem(role="user", text="typed"), {"type": "input_text", "text": "typed"}),
        (
            ConversationItem(role="system", text="be brief"),
            {"type": "input_text", "text": "be brief"},
        ),
        (ASSISTANT, {"type": "output_audio", "transcript": "Hi there"}),
        (
            ConversationItem(role="assistant", text="Text only"),
            {"type": "output_text", "text": "Text only"},
        ),
    ],
)
def test_conversation_item_created_carries_a_ga_item(
    item: ConversationItem, part: dict[str, Any]
) -> None:
    out = wire(ev.ConversationItemCreated(item=item, previous_item_id="item_0"))
    assert out["previous_item_id"] == "item_0"
    assert out["item"] == {
        "id": item.id,
        "object": "realtime.item",
        "type": "message",
        "status": item.status,
        "role": item.role,
        "content": [part],
    }


def test_item_truncated_and_transcription_completed() -> None:
    truncated = wire(ev.ConversationItemTruncated(item_id="item_a", audio_end_ms=350))
    assert truncated | {"event_id": None} == {
        "type": "conversation.item.truncated",
        "event_id": None,
        "item_id": "item_a",
        "content_index": 0,
        "audio_end_ms": 350,
    }
    done = wire(ev.InputTranscriptionCompleted(item_id="item_u", transcript="hello"))
    assert (done["item_id"], done["content_index"], done["transcript"]) == ("item_u", 0, "hello")
    assert "logprobs" not in done  # not asked for


def test_a_transcripts_tokens_are_openais_logprobs() -> None:
    tokens = [
        {"token": "caf", "logprob": -0.25, "bytes": [99, 97, 102]},
        {"token": "\ufffd", "logprob": -0.5, "bytes": [0xC3]},
        {"token": "\ufffd", "logprob": -0.125, "bytes": [0xA9]},
    ]
    done = wire(ev.InputTranscriptionCompleted(item_id="item_u", transcript="café", logprobs=CAFE))
    delta = wire(ev.InputTranscriptionDelta(item_id="item_u", delta="café", logprobs=CAFE))
    assert done["logprobs"] == delta["logprobs"] == tokens
    assert wire(ev.InputTranscriptionDelta(item_id="item_u", delta="café", logprobs=())) | {
        "event_id": None
    } == {
        "type": "conversation.item.input_audio_transcription.delta",
        "event_id": None,
        "item_id": "item_u",
        "content_index": 0,
        "delta": "café",
        "logprobs": [],
    }


def test_response_created() -> None:
    response = wire(ev.ResponseCreated(response_id="resp_1"))["response"]
    assert response["id"] == "resp_1"
    assert response["object"] == "realtime.response"
    assert response["status"] == "in_progress"
    assert response["output"] == []


def test_response_metadata_is_echoed_in_created_and_done() -> None:
    meta = {"client_event_id": "lk_1"}
    created = wire(ev.ResponseCreated(response_id="resp_1", metadata=meta))["response"]
    done = wire(ev.ResponseDone(response_id="resp_1", status="completed", metadata=meta))
    assert created["metadata"] == meta and done["response"]["metadata"] == meta
    assert RealtimeResponse.model_validate(created).metadata == meta
    assert wire(ev.ResponseCreated(response_id="resp_1"))["response"]["metadata"] is None


@pytest.mark.parametrize("eagerness", ["low", "medium", "high", "auto"])
def test_semantic_vad_is_shown_as_the_client_set_it(eagerness: str) -> None:
    vad = {"type": "semantic_vad", "eagerness": eagerness}
    config = SessionConfig.parse({"turn_detection": vad})
    shown = session_object(config)["audio"]["input"]["turn_detection"]
    assert shown == {**vad, "create_response": True, "interrupt_response": True}
    sdk = TypeAdapter(RealtimeAudioInputTurnDetection).validate_python(shown)
    assert sdk is not None and sdk.type == "semantic_vad" and sdk.eagerness == eagerness
    server = session_object(CONFIG)["audio"]["input"]["turn_detection"]
    assert server["type"] == "server_vad" and "eagerness" not in server


@pytest.mark.parametrize("cls", [ev.OutputTextDelta, ev.OutputAudioTranscriptDelta])
def test_text_deltas_say_where_they_belong(
    cls: type[ev.OutputTextDelta] | type[ev.OutputAudioTranscriptDelta],
) -> None:
    out = wire(cls(response_id="resp_1", item_id="item_a", delta="Hel"))
    assert {k: out[k] for k in ("response_id", "item_id", "output_index", "content_index")} == {
        "response_id": "resp_1",
        "item_id": "item_a",
        "output_index": 0,
        "content_index": 0,
    }
    assert out["delta"] == "Hel"


def test_audio_delta_is_base64_pcm_or_omitted() -> None:
    pcm = bytes(range(16))
    event = ev.OutputAudioDelta(response_id="resp_1", item_id="item_a", pcm=pcm, sample_rate=24_000)
    out = wire(event)
    assert base64.b64decode(out["delta"]) == pcm
    assert (out["response_id"], out["item_id"], out["output_index"]) == ("resp_1", "item_a", 0)
    assert to_wire(event, audio="omit") is None


def test_response_done_completed_has_the_item_and_parleys_usage() -> None:
    usage = ev.ResponseUsage(
        input_audio_ms=900, output_audio_ms=700, output_text_chars=8, first_audio_ms=80.0
    )
    event = ev.ResponseDone(response_id="resp_1", status="completed", item=ASSISTANT, usage=usage)
    response = wire(event)["response"]
    assert response["id"] == "resp_1"
    assert response["object"] == "realtime.response"
    assert response["status"] == "completed"
    assert response["status_details"] is None
    assert response["output"][0]["id"] == "item_a"
    assert response["output"][0]["content"] == [{"type": "output_audio", "transcript": "Hi there"}]
    measured = response["usage"]["parley"]
    assert measured["input_audio_ms"] == 900
    assert measured["output_audio_ms"] == 700
    assert measured["first_audio_ms"] == 80.0
    assert measured["first_text_ms"] is None
    # OpenAI's token fields, estimated: ten tokens a second of audio, four characters a token
    assert response["usage"]["input_token_details"]["audio_tokens"] == 9
    assert response["usage"]["output_token_details"] == {"text_tokens": 2, "audio_tokens": 7}
    assert response["usage"]["total_tokens"] == 18
    assert response["conversation_id"] is not None and response["max_output_tokens"] == "inf"


@pytest.mark.parametrize(
    ("reason", "wire_reason"),
    [
        ("barge_in", "turn_detected"),
        ("superseded", "turn_detected"),  # a new turn's answer replaced it
        ("client_cancelled", "client_cancelled"),
        ("client_closed", "client_cancelled"),
    ],
)
def test_response_done_cancelled_says_why(reason: str, wire_reason: str) -> None:
    event = ev.ResponseDone(response_id="resp_1", status="cancelled", reason=reason)
    response = wire(event)["response"]
    assert response["status"] == "cancelled"
    assert response["status_details"] == {
        "type": "cancelled",
        "reason": wire_reason,  # OpenAI's set; Parley's own reason is under `parley`
        "parley": {"reason": reason},
    }
    assert response["output"] == []


@pytest.mark.parametrize(
    "reason", ["idle_timeout", "max_duration", "client_disconnected", "server_shutdown"]
)
def test_a_response_the_server_cut_short_is_incomplete_never_client_cancelled(
    reason: str,
) -> None:
    """Nobody cancelled it: OpenAI's `reason` has no word for this (and the Agents SDK
    validates it against its four), so it is left out and Parley's is under `parley`."""
    event = ev.ResponseDone(response_id="resp_1", status="cancelled", reason=reason)
    response = wire(event)["response"]
    assert response["status"] == "incomplete"
    assert response["status_details"] == {
        "type": "incomplete",
        "reason": None,
        "parley": {"reason": reason},
    }


def test_response_done_failed_carries_the_error() -> None:
    event = ev.ResponseDone(response_id="resp_1", status="failed", reason="model error: boom")
    details = wire(event)["response"]["status_details"]
    assert details["type"] == "failed"
    assert details["error"]["message"] == "model error: boom"


def test_error_event_points_at_the_client_event() -> None:
    event = ev.ErrorEvent(
        code="invalid_config", message="voice: bad", client_event_id="c1", param="voice"
    )
    assert wire(event)["error"] == {
        "type": "invalid_request_error",
        "code": "invalid_config",
        "message": "voice: bad",
        "param": "voice",
        "event_id": "c1",
    }


def test_parleys_own_events_pass_through_with_their_fields() -> None:
    changed = wire(ev.SessionStateChanged(previous="listening", state="thinking", reason="r"))
    assert (changed["previous"], changed["state"], changed["reason"]) == (
        "listening",
        "thinking",
        "r",
    )
    assert wire(ev.SessionExpiring(seconds_left=60))["seconds_left"] == 60
    assert wire(ev.SessionClosed(reason="idle_timeout"))["reason"] == "idle_timeout"


@pytest.mark.parametrize("kind", ["started", "stopped", "cleared"])
def test_output_audio_buffer_events(kind: str) -> None:
    out = output_audio_buffer_event(kind, "resp_1")  # type: ignore[arg-type]
    assert out["type"] == f"output_audio_buffer.{kind}"
    assert out["response_id"] == "resp_1"
    assert out["event_id"].startswith("evt_")


SDK_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


def test_parleys_own_events_go_only_to_a_client_that_opted_in() -> None:
    for event in samples():
        out = to_wire(event)
        assert (out is None) == isinstance(event, PARLEY_EVENTS), event.type
    assert SessionConfig.parse({"extra_events": True}).extra_events


@pytest.mark.parametrize(
    "event", [e for e in samples() if not isinstance(e, PARLEY_EVENTS)], ids=lambda e: e.type
)
def test_every_ga_event_validates_against_the_openai_sdk(event: Event) -> None:
    """The shared mapping (both transports) as the `openai` SDK's models declare it; the
    transcript's `usage` comes from the connection's expander (it knows the item's audio)."""
    expander = GAExpander()
    expander.expand(ev.ConversationItemCreated(item=USER_AUDIO, previous_item_id=None), {})
    for message in expander.expand(event, wire(event)):
        parsed = SDK_EVENT.validate_python(message)
        assert parsed.type == message["type"]


def test_transcription_usage_is_the_duration_of_the_users_audio() -> None:
    expander = GAExpander()
    created = ev.ConversationItemCreated(item=USER_AUDIO, previous_item_id=None)
    expander.expand(created, wire(created))
    done = ev.InputTranscriptionCompleted(item_id="item_u", transcript="hello")
    [message] = expander.expand(done, wire(done))
    assert message["usage"] == {"type": "duration", "seconds": 0.9}


@pytest.mark.parametrize("kind", ["started", "stopped", "cleared"])
def test_output_audio_buffer_events_validate_against_the_openai_sdk(kind: str) -> None:
    message = output_audio_buffer_event(kind, "resp_1")  # type: ignore[arg-type]
    assert SDK_EVENT.validate_python(message).type == f"output_audio_buffer.{kind}"
