"""A transcription session on OpenAI Realtime's wire: its session object.

`session.created` and `session.updated` of a transcription session carry OpenAI's
`realtime.transcription_session`: the input side only (format, transcription, noise
reduction, turn detection) and `include`; no instructions, voice, tools or output. Parley's
own values (the resume token, `min_speech_ms`, ...) are under `parley` as in a
conversation session. Turn detection shows OpenAI's fields of a transcription session; it
never answers, so `create_response` and `interrupt_response` are always false (a `true` is
refused: realtime/openai/session_fields.py).
"""

from __future__ import annotations

from typing import Any

from sessions import SessionConfig, TurnDetectionConfig

from .client_events import AudioFormats, format_object


def transcription_session_object(
    config: SessionConfig,
    session_id: str | None = None,
    *,
    formats: AudioFormats | None = None,
    resume_token: str | None = None,
) -> dict[str, Any]:
    """The GA `realtime.transcription_session` object for `config`."""
    formats = formats or AudioFormats.for_config(config)
    td = config.turn_detection
    parley: dict[str, Any] = {
        "min_speech_ms": td.min_speech_ms if td is not None else None,
        "max_audio_seconds": config.max_audio_seconds,
        "extra_events": config.extra_events,
    }
    if resume_token is not None:
        parley["resume_token"] = resume_token
    session: dict[str, Any] = {"type": "transcription", "object": "realtime.transcription_session"}
    if session_id is not None:
        session["id"] = session_id
    transcription = config.input_transcription
    noise = config.noise_reduction
    session |= {
        "audio": {
            "input": {
                "format": format_object(formats.input, formats.input_rate),
                "transcription": (
                    transcription.model_dump(exclude_none=True) if transcription else None
                ),
                "noise_reduction": noise.model_dump(exclude_none=True) if noise else None,
                "turn_detection": _turn_detection(td),
            }
        },
        "include": list(config.include) or None,
        "parley": parley,
    }
    return session


def _turn_detection(td: TurnDetectionConfig | None) -> dict[str, Any] | None:
    if td is None:
        return None
    answers = {"create_response", "interrupt_response"}
    if td.type == "semantic_vad":
        return td.model_dump(include={"type", "eagerness"} | answers)
    shown = {"type", "threshold", "prefix_padding_ms", "silence_duration_ms"} | answers
    return td.model_dump(include=shown)
