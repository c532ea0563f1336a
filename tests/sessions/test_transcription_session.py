"""What a transcription session refuses: a pipeline with no recogniser (named), a change
back to a realtime session, a change while an answer is in progress, responses and the
client's items."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.graph_config import StageConfig
from pipeline.recognition import speech_recogniser
from sessions import ConfigError, SessionConfig
from sessions.errors import InvalidRequestError
from sessions.transcription_session import (
    check_recogniser,
    check_type_change,
    refuse_item,
    refuse_response,
)

REALTIME = SessionConfig()
TRANSCRIPTION = SessionConfig(type="transcription")


def graph(name: str, *stages: tuple[str, dict[str, str]]) -> SimpleNamespace:
    """A stand-in for a StageGraph: its name and its graph file's stages."""
    config = SimpleNamespace(
        stages=[
            StageConfig(name=f"s{i}", engine=e, engine_args=a) for i, (e, a) in enumerate(stages)
        ]
    )
    return SimpleNamespace(name=name, config=config)


CASCADE = graph("cascade", ("cascade.thinker", {}), ("cascade.talker", {}))
ECHO = graph("echo", ("echo", {}))


def test_which_pipelines_recognise_speech() -> None:
    assert speech_recogniser(CASCADE) == "whisper"
    assert speech_recogniser(graph("c", ("cascade.thinker", {"recognizer": "pocketsphinx"}))) == (
        "pocketsphinx"
    )
    assert speech_recogniser(graph("v", ("openai_chat.thinker", {"recognizer": "none"}))) is None
    assert speech_recogniser(ECHO) is None
    assert speech_recogniser(graph("moshi_tiny", ("moshi.duplex", {}))) is None
    assert speech_recogniser(SimpleNamespace(recogniser="whisper")) == "whisper"
    assert speech_recogniser(SimpleNamespace(recogniser=None)) is None


def test_a_pipeline_without_a_recogniser_is_named_in_the_refusal() -> None:
    check_recogniser(REALTIME, ECHO)
    check_recogniser(TRANSCRIPTION, CASCADE)
    with pytest.raises(ConfigError, match="'echo'") as refused:
        check_recogniser(TRANSCRIPTION, ECHO)
    assert refused.value.field == "type"


def test_a_realtime_session_may_become_a_transcription_session_once_and_only_idle() -> None:
    check_type_change(REALTIME, TRANSCRIPTION, CASCADE, responding=False)
    with pytest.raises(ConfigError, match="in progress"):
        check_type_change(REALTIME, TRANSCRIPTION, CASCADE, responding=True)
    with pytest.raises(ConfigError, match="'echo'"):
        check_type_change(REALTIME, TRANSCRIPTION, ECHO, responding=False)
    with pytest.raises(ConfigError, match="cannot become"):
        check_type_change(TRANSCRIPTION, REALTIME, CASCADE, responding=False)


def test_a_transcription_session_has_no_responses_and_never_answers_a_turn() -> None:
    refuse_response(REALTIME)
    refuse_item(REALTIME)
    with pytest.raises(InvalidRequestError, match=r"^response\.create is not supported"):
        refuse_response(TRANSCRIPTION)
    with pytest.raises(InvalidRequestError, match=r"^conversation\.item\.create is not"):
        refuse_item(TRANSCRIPTION)
    td = TRANSCRIPTION.turn_detection
    assert td is not None and not td.create_response and not td.interrupt_response
    assert TRANSCRIPTION.updated({"turn_detection": {"create_response": True}}).turn_detection
    kept = TRANSCRIPTION.updated({"turn_detection": {"create_response": True}}).turn_detection
    assert kept is not None and not kept.create_response
