"""The session's `audio.input.transcription` as the pipeline's recogniser takes it.

A client names the language its user speaks and a prompt (names, terms, or the text
before) to recognise the user's speech with; every recognition of the session's audio (a
turn answered, a turn only transcribed, the words at a pause) carries them
(`PipelineRequest.recognition`). The model a client names is echoed, not obeyed: the
pipeline has one recogniser.
"""

from __future__ import annotations

from pipeline.types import RecognitionHints

from .config import SessionConfig


def recognition_hints(config: SessionConfig) -> RecognitionHints:
    """The language and prompt of `config`'s input transcription (none if it has none)."""
    asked = config.input_transcription
    if asked is None:
        return RecognitionHints()
    return RecognitionHints(language=asked.language or "", prompt=asked.prompt or "")
