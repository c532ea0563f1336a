"""Transcription sessions (OpenAI's `type: "transcription"`): a session that only
transcribes what the user says.

It is an ordinary session with its answers taken away, so nothing here runs on its own:
the input audio path, the turn detection (`server_vad`, `semantic_vad`, or none and the
client's commits) and the item transcriber are the conversation session's. Its settings
make every committed turn one that no answer follows (`SessionConfig._no_answers`: turn
detection with `create_response` off), so the transcriber (transcription.py) recognises
each one with the pipeline's recogniser and sends `...input_audio_transcription.delta` and
`.completed`. What this module adds is what such a session refuses:

- to start on a pipeline with no recogniser (`--pipeline echo`, a duplex model), an error
  that names the pipeline (pipeline/recognition.py says which have one);
- `response.create`, as OpenAI does: a transcription session has no responses;
- `conversation.item.create` (the protocol's dispatcher asks): a transcription session's
  items are the turns of its input audio, so an item the client makes would be one nothing
  reads;
- a change of type: a conversation session may become a transcription session (the first
  `session.update` of a client that connected without `intent=transcription`) while no
  answer is in progress, never back.
"""

from __future__ import annotations

from typing import Any

from pipeline.recognition import pipeline_name, speech_recogniser

from .config import SessionConfig
from .errors import ConfigError, InvalidRequestError


def check_recogniser(config: SessionConfig, pipeline: Any) -> None:
    """ConfigError (field `type`) when `config` is a transcription session and `pipeline`
    has no recogniser to serve it."""
    if config.type == "transcription" and speech_recogniser(pipeline) is None:
        raise ConfigError(
            "type",
            f"transcription sessions need a speech recogniser, and the pipeline "
            f"{pipeline_name(pipeline)!r} has none (use a pipeline with one, such as "
            "'cascade')",
        )


def check_type_change(
    old: SessionConfig, new: SessionConfig, pipeline: Any, *, responding: bool
) -> None:
    """ConfigError (field `type`) when a session.update may not change the session's type
    from `old`'s to `new`'s."""
    if old.type == new.type:
        return
    if old.type == "transcription":
        raise ConfigError("type", "a transcription session cannot become a realtime session")
    if responding:
        raise ConfigError(
            "type", "a response is in progress: cancel it before making this a transcription"
        )
    check_recogniser(new, pipeline)


def refuse_response(config: SessionConfig) -> None:
    """`response.create` in a transcription session: OpenAI's error."""
    _refuse(
        config, "response.create", "a transcription session transcribes its input and never answers"
    )


def refuse_item(config: SessionConfig) -> None:
    """`conversation.item.create` in a transcription session: an error naming the event."""
    _refuse(
        config,
        "conversation.item.create",
        "a transcription session's items are the turns of its input audio "
        "(input_audio_buffer.append, or the microphone's track over WebRTC)",
    )


def _refuse(config: SessionConfig, event: str, why: str) -> None:
    """InvalidRequestError naming `event` when `config` is a transcription session; the
    session goes on."""
    if config.type == "transcription":
        raise InvalidRequestError(
            f"{event} is not supported in transcription sessions: {why}", "invalid_request"
        )
