"""What the recogniser is told of a session's `audio.input.transcription`: its language
and prompt, OpenAI's `keywords` before the prompt, and a one-language `languages` when no
`language` is given; and whether `include` asks for the tokens' log-probabilities."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.types import RecognitionHints
from sessions.config import SessionConfig
from sessions.errors import ConfigError
from sessions.recognition_hints import recognition_hints


def hints(**transcription: Any) -> RecognitionHints:
    return recognition_hints(SessionConfig().updated({"input_transcription": transcription}))


def test_no_transcription_settings_tell_the_recogniser_nothing() -> None:
    assert recognition_hints(SessionConfig()) == RecognitionHints()
    assert hints(model="whisper-1") == RecognitionHints()


def test_keywords_come_before_the_prompt() -> None:
    assert hints(keywords=["Parley", "Ana Ruiz"]).prompt == "Parley, Ana Ruiz"
    both = hints(keywords=["Parley"], prompt="The call is about the order.")
    assert both.prompt == "Parley. The call is about the order."
    assert hints(keywords=["", " "], prompt="Names.").prompt == "Names."


def test_one_language_of_languages_stands_in_for_language() -> None:
    assert hints(languages=["fr"]).language == "fr"
    assert hints(language="de", languages=["fr"]).language == "de"


@pytest.mark.parametrize("languages", [["fr", "de"], [], ["xx"]])
def test_several_none_or_unknown_languages_are_not_a_setting(languages: list[str]) -> None:
    with pytest.raises(ConfigError, match="input_transcription.languages"):
        SessionConfig().updated({"input_transcription": {"languages": languages}})


def test_include_asks_for_the_tokens_log_probabilities_with_or_without_settings() -> None:
    included = SessionConfig().updated({"include": ["item.input_audio_transcription.logprobs"]})
    assert recognition_hints(included) == RecognitionHints(logprobs=True)
    french = included.updated({"input_transcription": {"language": "fr"}})
    assert recognition_hints(french) == RecognitionHints(language="fr", logprobs=True)
    assert not recognition_hints(french.updated({"include": []})).logprobs
