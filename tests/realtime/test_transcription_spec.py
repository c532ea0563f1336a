"""The transcription settings of a session object: read into a patch (GA, beta), refused
with the parameter named, and echoed as OpenAI's transcription session object."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.realtime import SessionCreatedEvent
from openai.types.realtime.realtime_transcription_session_create_request import (
    RealtimeTranscriptionSessionCreateRequest,
)

from realtime.openai.client_events import (
    ProtocolError,
    SessionUpdate,
    parse_client_event,
    partial_session_patch,
)
from realtime.openai.server_events import session_object
from sessions import SessionConfig

GA = {
    "type": "transcription",
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24_000},
            "transcription": {"model": "gpt-4o-mini-transcribe", "language": "en"},
            "noise_reduction": {"type": "far_field"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 350},
        }
    },
    "include": ["item.input_audio_transcription.logprobs"],
}
BETA = {
    "type": "transcription",
    "input_audio_format": "pcm16",
    "input_audio_transcription": {"model": "gpt-4o-mini-transcribe", "language": "en"},
    "input_audio_noise_reduction": {"type": "far_field"},
    "turn_detection": {"type": "server_vad", "silence_duration_ms": 350},
    "include": ["item.input_audio_transcription.logprobs"],
}


def patch_of(session: dict[str, Any]) -> tuple[dict[str, Any], list[ProtocolError]]:
    patch, _formats, errors = partial_session_patch(
        SessionUpdate.model_validate({"session": session})
    )
    return patch, errors


def test_ga_and_beta_spellings_give_the_same_settings() -> None:
    ga, ga_errors = patch_of(GA)
    beta, beta_errors = patch_of(BETA)
    assert ga == beta and not ga_errors and not beta_errors
    config = SessionConfig().updated(ga)
    assert config.type == "transcription"
    assert config.input_transcription is not None
    assert config.input_transcription.language == "en"
    assert config.noise_reduction is not None and config.noise_reduction.type == "far_field"
    assert config.include == ("item.input_audio_transcription.logprobs",)
    td = config.turn_detection
    assert td is not None and not td.create_response and not td.interrupt_response


def test_the_session_object_is_openais_transcription_session() -> None:
    config = SessionConfig().updated(patch_of(GA)[0])
    session = session_object(config, "sess_1", resume_token="tok")
    assert session["object"] == "realtime.transcription_session"
    audio_in = session["audio"]["input"]
    assert audio_in["transcription"] == {"model": "gpt-4o-mini-transcribe", "language": "en"}
    assert audio_in["noise_reduction"] == {"type": "far_field"}
    assert audio_in["turn_detection"] == {
        "type": "server_vad",
        "threshold": 0.5,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 350,
        "create_response": False,
        "interrupt_response": False,
    }
    assert "instructions" not in session and "output_modalities" not in session
    assert session["parley"]["resume_token"] == "tok"
    event = SessionCreatedEvent.model_validate(
        {"type": "session.created", "event_id": "evt_1", "session": session}
    )
    assert isinstance(event.session, RealtimeTranscriptionSessionCreateRequest)


def test_semantic_vad_and_no_turn_detection_echo_as_set() -> None:
    semantic = {**GA, "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}
    config = SessionConfig().updated(patch_of(semantic)[0])
    echoed = session_object(config)["audio"]["input"]["turn_detection"]
    assert echoed == {
        "type": "semantic_vad",
        "eagerness": "auto",
        "create_response": False,
        "interrupt_response": False,
    }
    manual = SessionConfig().updated(
        patch_of({**GA, "audio": {"input": {"turn_detection": None}}})[0]
    )
    assert session_object(manual)["audio"]["input"]["turn_detection"] is None


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"type": "translation"}, "session.type"),
        ({"include": ["item.everything"]}, "session.include"),
        (
            {"audio": {"input": {"noise_reduction": {"type": "studio"}}}},
            "session.audio.input.noise_reduction.type",
        ),
        (
            {"input_audio_noise_reduction": {"type": "studio"}},
            "session.input_audio_noise_reduction.type",
        ),
    ],
)
def test_values_parley_cannot_take_are_errors_naming_them(
    session: dict[str, Any], param: str
) -> None:
    patch, errors = patch_of({**session, "instructions": "kept"})
    assert [e.field for e in errors] == [param]
    assert patch == {"instructions": "kept"}  # the rest applies


def test_cleared_settings_are_none_again() -> None:
    config = SessionConfig().updated(patch_of(GA)[0])
    cleared = {"audio": {"input": {"transcription": None, "noise_reduction": None}}}
    config = config.updated(patch_of(cleared)[0])
    assert config.input_transcription is None and config.noise_reduction is None
    assert config.type == "transcription"


def test_betas_transcription_session_update_is_a_session_update_of_a_transcription() -> None:
    raw = json.dumps({"type": "transcription_session.update", "event_id": "e1", "session": BETA})
    event = parse_client_event(raw)
    assert isinstance(event, SessionUpdate) and event.event_id == "e1"
    assert partial_session_patch(event)[0] == patch_of(GA)[0]


def test_keywords_and_one_language_are_kept_and_a_delay_or_two_languages_refused() -> None:
    """`keywords` and a one-language `languages` are settings (they reach the recogniser:
    tests/sessions/test_recognition_hints.py); a `delay` or several languages are errors
    naming them, and the rest of the transcription applies."""
    asked = {"model": "gpt-transcribe", "keywords": ["Parley"], "languages": ["fr"]}
    patch, errors = patch_of({"audio": {"input": {"transcription": asked}}})
    assert not errors and patch == {"input_transcription": asked}
    refused = {"prompt": "Names.", "delay": "low", "languages": ["fr", "de"]}
    patch, errors = patch_of({"audio": {"input": {"transcription": refused}}})
    where = "session.audio.input.transcription"
    assert sorted(e.field or "" for e in errors) == [f"{where}.delay", f"{where}.languages"]
    assert patch == {"input_transcription": {"prompt": "Names."}}


def test_noise_reduction_strength_is_kept_within_zero_to_one() -> None:
    strong = {"audio": {"input": {"noise_reduction": {"type": "far_field", "strength": 0.5}}}}
    patch, errors = patch_of(strong)
    assert not errors and patch == {"noise_reduction": {"type": "far_field", "strength": 0.5}}
    too = {"audio": {"input": {"noise_reduction": {"type": "far_field", "strength": 2}}}}
    patch, errors = patch_of(too)
    assert [e.field for e in errors] == ["session.audio.input.noise_reduction.strength"]
    assert patch == {}
