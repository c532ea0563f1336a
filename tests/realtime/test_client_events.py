"""Client events parse into typed models; anything else is a ProtocolError a developer can read."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from realtime.openai.client_events import (
    AudioFormats,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    OutputAudioBufferClear,
    ProtocolError,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    parse_client_event,
    partial_session_patch,
    session_patch,
)
from realtime.openai.client_items import client_item
from sessions.config import SessionConfig

JPEG_URL = "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8\xff\xe0jpeg").decode()


MCP = {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1/mcp"}


def raw(**fields: Any) -> str:
    return json.dumps(fields)


@pytest.mark.parametrize(
    ("fields", "cls"),
    [
        ({"type": "session.update", "session": {"instructions": "hi"}}, SessionUpdate),
        ({"type": "input_audio_buffer.append", "audio": "AAA="}, InputAudioBufferAppend),
        ({"type": "input_audio_buffer.commit"}, InputAudioBufferCommit),
        ({"type": "input_audio_buffer.clear"}, InputAudioBufferClear),
        (
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hello"}],
                },
            },
            ConversationItemCreate,
        ),
        (
            {
                "type": "conversation.item.truncate",
                "item_id": "item_a",
                "content_index": 0,
                "audio_end_ms": 1500,
            },
            ConversationItemTruncate,
        ),
        ({"type": "conversation.item.delete", "item_id": "item_a"}, ConversationItemDelete),
        ({"type": "response.create"}, ResponseCreate),
        ({"type": "response.create", "response": {"instructions": "x"}}, ResponseCreate),
        ({"type": "response.cancel"}, ResponseCancel),
        ({"type": "output_audio_buffer.clear"}, OutputAudioBufferClear),
    ],
    ids=lambda v: v["type"] if isinstance(v, dict) else "",
)
def test_each_client_event_parses(fields: dict[str, Any], cls: type) -> None:
    event = parse_client_event(raw(event_id="evt_c1", **fields))
    assert isinstance(event, cls)
    assert event.event_id == "evt_c1"
    assert event.type == fields["type"]


def test_parses_bytes_and_fields() -> None:
    event = parse_client_event(
        raw(type="conversation.item.truncate", item_id="item_a", audio_end_ms=1500).encode()
    )
    assert isinstance(event, ConversationItemTruncate)
    assert (event.item_id, event.content_index, event.audio_end_ms) == ("item_a", 0, 1500)
    append = parse_client_event(raw(type="input_audio_buffer.append", audio="AQACAA=="))
    assert isinstance(append, InputAudioBufferAppend)
    assert append.pcm() == b"\x01\x00\x02\x00"


def test_image_content_decodes_its_data_url() -> None:
    event = parse_client_event(
        raw(
            type="conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": JPEG_URL, "detail": "auto"},
                    {"type": "input_text", "text": "what is this?"},
                ],
            },
        )
    )
    assert isinstance(event, ConversationItemCreate)
    made = client_item(event.item, None)
    assert made.images == (b"\xff\xd8\xff\xe0jpeg",)
    assert made.item is not None and made.item.text == "what is this?"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://example.com/cat.jpg", "data URL"),
        ("data:image/gif;base64,R0lGOD==", "image/gif"),
        ("data:image/jpeg;base64,not*base64", "base64"),
    ],
)
def test_bad_image_urls_are_refused(url: str, words: str) -> None:
    event = parse_client_event(
        raw(
            type="conversation.item.create",
            item={"role": "user", "content": [{"type": "input_image", "image_url": url}]},
        )
    )
    assert isinstance(event, ConversationItemCreate)
    with pytest.raises(ProtocolError, match=words) as err:
        client_item(event.item, None)
    assert err.value.code == "invalid_value"


@pytest.mark.parametrize(
    ("message", "code", "words", "event_id"),
    [
        ("{not json", "invalid_json", "not valid JSON", None),
        (b"\xff\xfe\x00", "invalid_json", "not valid JSON", None),
        ("[1, 2]", "invalid_event", "JSON object, not an array", None),
        ('"hello"', "invalid_event", "JSON object, not a string", None),
        (raw(event_id="e1"), "missing_required_parameter", "no 'type'", "e1"),
        (
            raw(event_id="e2", type="session.explode"),
            "unknown_event_type",
            "'session.explode'",
            "e2",
        ),
        (raw(event_id="e3", type=7), "unknown_event_type", "unknown event type 7", "e3"),
        (
            raw(event_id="e4", type="conversation.item.truncate", item_id="i", audio_end_ms="1"),
            "invalid_type",
            "'audio_end_ms' must be an integer, got '1'",
            "e4",
        ),
        (
            raw(event_id="e5", type="session.update", session="fast"),
            "invalid_type",
            "'session' must be an object",
            "e5",
        ),
        (
            raw(event_id="e7", type="input_audio_buffer.append"),
            "missing_required_parameter",
            "missing 'audio'",
            "e7",
        ),
        (
            raw(event_id="e8", type="response.cancel", extra=1),
            "unknown_parameter",
            "unknown parameter 'extra'",
            "e8",
        ),
        (
            raw(
                event_id="e9",
                type="conversation.item.create",
                item={"role": "user", "content": [{"type": "input_video", "data": "AA=="}]},
            ),
            "invalid_value",
            "'item.content[0].type': input should be 'input_text', 'input_image'",
            "e9",
        ),
        (
            raw(
                event_id="e10",
                type="conversation.item.create",
                item={"role": "user", "content": [{"type": "input_text"}]},
            ),
            "invalid_value",
            "an input_text part needs 'text'",
            "e10",
        ),
        (
            raw(event_id="e11", type="conversation.item.truncate", item_id="i", audio_end_ms=-5),
            "invalid_value",
            "greater than or equal to 0",
            "e11",
        ),
        (
            raw(event_id=12, type="response.create"),
            "invalid_type",
            "'event_id' must be a string",
            None,
        ),
    ],
)
def test_malformed_events_raise_a_clear_protocol_error(
    message: str | bytes, code: str, words: str, event_id: str | None
) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_client_event(message)
    assert err.value.code == code
    assert words in str(err.value)
    assert err.value.event_id == event_id


def test_wrong_type_names_the_param() -> None:
    with pytest.raises(ProtocolError) as err:
        parse_client_event(raw(type="conversation.item.truncate", item_id="i", audio_end_ms=True))
    assert err.value.field == "audio_end_ms"


# --- session.update -> patch ---------------------------------------------------------------

GA = {
    "type": "realtime",
    "instructions": "Be brief.",
    "output_modalities": ["audio"],
    "audio": {
        "input": {
            "format": {"type": "audio/pcmu"},
            "turn_detection": {
                "type": "server_vad",
                "threshold": 0.7,
                "prefix_padding_ms": 200,
                "silence_duration_ms": 600,
                "create_response": False,
                "interrupt_response": True,
            },
        },
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"},
    },
    "tools": [],
    "tracing": None,
}
BETA = {
    "instructions": "Be brief.",
    "modalities": ["text", "audio"],
    "voice": "marin",
    "input_audio_format": "g711_ulaw",
    "output_audio_format": "pcm16",
    "turn_detection": {
        "type": "server_vad",
        "threshold": 0.7,
        "prefix_padding_ms": 200,
        "silence_duration_ms": 600,
        "create_response": False,
        "interrupt_response": True,
    },
    "temperature": 0.8,
    "tools": [],
    "tracing": None,
}


def update(session: dict[str, Any], event_id: str = "evt_u") -> SessionUpdate:
    event = parse_client_event(raw(type="session.update", event_id=event_id, session=session))
    assert isinstance(event, SessionUpdate)
    return event


def test_ga_and_beta_session_updates_give_the_same_patch() -> None:
    ga_patch, ga_formats = session_patch(update(GA))
    beta_patch, beta_formats = session_patch(update(BETA))
    assert ga_patch == beta_patch
    assert ga_formats == beta_formats == AudioFormats(input="audio/pcmu", input_rate=8_000)
    assert ga_patch == {
        "instructions": "Be brief.",
        "output_modalities": ["audio"],
        "voice": "marin",
        "turn_detection": {
            "type": "server_vad",
            "threshold": 0.7,
            "prefix_padding_ms": 200,
            "silence_duration_ms": 600,
            "create_response": False,
            "interrupt_response": True,
        },
        "output_sample_rate": 24_000,
        "tools": [],
        "mcp_tools": [],
        "tracing": None,
    }
    config = SessionConfig().updated(ga_patch)  # the patch is one the session takes
    assert config.turn_detection is not None and config.turn_detection.threshold == 0.7


@pytest.mark.parametrize(
    ("modalities", "expected"),
    [(["text", "audio"], ["audio"]), (["audio"], ["audio"]), (["text"], ["text"])],
)
def test_modalities_map_to_output_modalities(modalities: list[str], expected: list[str]) -> None:
    assert session_patch(update({"modalities": modalities}))[0] == {"output_modalities": expected}
    assert session_patch(update({"output_modalities": modalities}))[0] == {
        "output_modalities": expected
    }


def test_null_turn_detection_means_manual_turns_and_absent_means_unchanged() -> None:
    assert session_patch(update({"audio": {"input": {"turn_detection": None}}}))[0] == {
        "turn_detection": None
    }
    assert session_patch(update({"turn_detection": None}))[0] == {"turn_detection": None}
    assert session_patch(update({"audio": {"input": {}}}))[0] == {}


@pytest.mark.parametrize("where", ["ga", "beta"])
def test_semantic_vad_is_taken_as_sent(where: str) -> None:
    vad = {"type": "semantic_vad", "eagerness": "high", "interrupt_response": False}
    session = (
        {"audio": {"input": {"turn_detection": vad}}} if where == "ga" else {"turn_detection": vad}
    )
    assert session_patch(update(session))[0] == {"turn_detection": vad}


def test_a_bad_eagerness_or_vad_type_is_named_and_the_rest_kept() -> None:
    session = {
        "instructions": "kept",
        "turn_detection": {"type": "semantic_vad", "eagerness": "eager"},
        "audio": {"output": {"format": {"type": "audio/opus"}}},
    }
    patch, formats, errors = partial_session_patch(update(session, "evt_p"))
    assert patch == {"instructions": "kept"} and formats == AudioFormats()
    assert [(e.event_id, e.field) for e in errors] == [
        ("evt_p", "session.turn_detection.eagerness"),
        ("evt_p", "session.audio.output.format.type"),
    ]
    with pytest.raises(ProtocolError) as err:  # session_patch is all or nothing
        session_patch(update(session))
    assert err.value.field == "session.turn_detection.eagerness"
    unknown = {"audio": {"input": {"turn_detection": {"type": "magic_vad"}}}}
    (error,) = partial_session_patch(update(unknown))[2]
    assert error.field == "session.audio.input.turn_detection.type"


def test_formats_keep_what_the_update_leaves_out() -> None:
    start = AudioFormats(input="audio/pcma", input_rate=8_000)
    patch, formats = session_patch(
        update({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}), start
    )
    assert formats == AudioFormats(
        input="audio/pcma", input_rate=8_000, output="audio/pcmu", output_rate=8_000
    )
    assert patch == {"output_sample_rate": 8_000}
    assert session_patch(update({"instructions": "x"}), start)[1] == start


@pytest.mark.parametrize(
    ("session", "words"),
    [
        ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, "audio/opus"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 12_345}}}}, "12345 Hz"),
        ({"audio": {"output": {"format": {"type": "audio/pcmu", "rate": 16_000}}}}, "8000 Hz"),
        ({"input_audio_format": "mp3"}, "'mp3'"),
        ({"type": "conversation"}, "'conversation'"),
        ({"output_modalities": []}, "'audio' or 'text'"),
        ({"turn_detection": {"type": "push_to_talk"}}, "'push_to_talk'"),
        (
            {"turn_detection": None, "parley": {"min_speech_ms": 300}},
            "min_speech_ms needs voice activity",
        ),
    ],
)
def test_bad_session_settings_are_refused(session: dict[str, Any], words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        session_patch(update(session))


def test_pcm_at_another_rate_is_a_parley_extension() -> None:
    session = {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16_000}}}}
    assert session_patch(update(session))[1].input_rate == 16_000


def test_parley_extras_pass_into_the_patch() -> None:
    session = {
        "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
        "parley": {
            "video": {"max_frames": 10, "num_frames": 2},
            "min_speech_ms": 300,
            "max_audio_seconds": 60,
            "video_fps_idle": 0.5,  # a transport's own setting: let through, not patched
        },
    }
    patch, _ = session_patch(update(session))
    assert patch == {
        "turn_detection": {"type": "server_vad", "min_speech_ms": 300},
        "video": {"max_frames": 10, "num_frames": 2},
        "max_audio_seconds": 60,
    }
    config = SessionConfig().updated(patch)
    assert config.video.max_frames == 10
    assert config.turn_detection is not None and config.turn_detection.min_speech_ms == 300


def test_a_value_of_the_wrong_json_type_is_left_out_and_the_rest_applies() -> None:
    event = update(
        {
            "instructions": 3,
            "voice": "marin",
            "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": "hi"}}},
        },
        event_id="e6",
    )
    patch, _, errors = partial_session_patch(event)
    assert patch == {"voice": "marin", "turn_detection": {"type": "server_vad"}}
    assert [(e.code, e.field, e.event_id) for e in errors] == [
        ("invalid_type", "session.instructions", "e6"),
        ("invalid_type", "session.audio.input.turn_detection.threshold", "e6"),
    ]
    assert "must be a string, got 3" in str(errors[0])


def test_tools_tool_choice_and_token_caps_become_settings() -> None:
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    patch, _, errors = partial_session_patch(
        update(
            {
                "tools": [weather, MCP, {"type": "file_search"}],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "max_output_tokens": "inf",
                "audio": {"output": {"speed": 1.25}},
            }
        )
    )
    assert patch == {
        "tools": [weather],
        "mcp_tools": [MCP],
        "tool_choice": "get_weather",
        "max_output_tokens": None,
        "speed": 1.25,
    }
    assert [(e.code, e.field) for e in errors] == [("unsupported", "session.tools[2].type")]
    config = SessionConfig().updated(patch)
    assert config.tools[0].name == "get_weather" and config.tool_choice == "get_weather"
    assert config.mcp_tools[0].server_label == "x"  # an MCP server: listed and called


def test_interruption_and_its_deadline_are_taken_with_the_turn_detection() -> None:
    vad = {"type": "server_vad", "interruption": "adaptive"}
    parley = {"min_speech_ms": 300, "interruption_deadline_ms": 800}
    session = {"audio": {"input": {"turn_detection": vad}}, "parley": parley}
    patch = session_patch(update(session))[0]
    assert patch == {
        "turn_detection": {**vad, "min_speech_ms": 300, "interruption_deadline_ms": 800}
    }
    config = SessionConfig().updated(patch)
    assert config.turn_detection is not None
    assert (config.turn_detection.interruption, config.turn_detection.interruption_deadline_ms) == (
        "adaptive",
        800,
    )
    bad = {"turn_detection": {"type": "semantic_vad", "interruption": "never"}}
    (error,) = partial_session_patch(update(bad, "evt_i"))[2]
    assert (error.event_id, error.field) == ("evt_i", "session.turn_detection.interruption")
