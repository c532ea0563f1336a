"""The session object of OpenAI Realtime's `session.update`, and the checks of the values
inside it that need more than a type: turn detection and the audio formats.

Every field of OpenAI's GA session object (and of the beta spellings) is declared here, so
none is dropped unseen: a key that is not one is kept aside (`extra="allow"`) and refused as
an `unknown_parameter` naming its path (session_fields.py), as OpenAI refuses it, except
under `parley`, Parley's own. A value Parley cannot take is a `ProtocolError` naming its
parameter, and the rest of the update applies (client_events.py's `partial_session_patch`);
`session.updated` shows what took effect.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from pipeline.audio_format import OUTPUT_SAMPLE_RATE, SUPPORTED_INPUT_RATES, SUPPORTED_OUTPUT_RATES

from .wire_values import ProtocolError

PCM_RATE = OUTPUT_SAMPLE_RATE
G711_RATE = 8_000
G711_FORMATS = ("audio/pcmu", "audio/pcma")
_BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


class OpenObject(BaseModel):
    """An object of the session: keys Parley does not know are kept in `model_extra`, to be
    refused by name (session_fields.py), not to fail the whole object."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class AudioFormatSpec(OpenObject):
    type: str = "audio/pcm"
    """OpenAI's formats are objects whose `type` may be left out: PCM then."""
    rate: int | None = None


class TurnDetectionSpec(OpenObject):
    type: str
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: str | None = None
    idle_timeout_ms: int | None = None
    interruption: str | None = None
    """Parley's extension: `always` (OpenAI's meaning of interrupt_response) or `adaptive`
    (a backchannel or a noise does not cut the answer: sessions/overlap_judge.py)."""


class TranscriptionSpec(OpenObject):
    """`audio.input.transcription` (beta: `input_audio_transcription`)."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    keywords: list[str] | None = None
    languages: list[str] | None = None
    delay: str | None = None


class NoiseReductionSpec(OpenObject):
    type: str | None = None
    strength: float | None = None


class AudioInputSpec(OpenObject):
    format: AudioFormatSpec | None = None
    turn_detection: TurnDetectionSpec | None = None
    transcription: TranscriptionSpec | None = None
    noise_reduction: NoiseReductionSpec | None = None


class AudioOutputSpec(OpenObject):
    format: AudioFormatSpec | None = None
    voice: str | dict[str, Any] | None = None
    """A voice's name, or OpenAI's custom voice `{"id": ...}` (refused: none here)."""
    speed: float | None = None


class AudioSpec(OpenObject):
    input: AudioInputSpec | None = None
    output: AudioOutputSpec | None = None


class ParleyExtras(OpenObject):
    """Parley's own settings, under the session's `parley` key.

    The session takes these five (`extra_events`: send Parley's own server events, such
    as `session.state_changed`, which OpenAI's API does not have; off by default, as an
    OpenAI client may reject them); a transport may read more of its own here (the WebRTC
    call's `video_fps_idle` and `video_fps_speaking`), so other keys are let through.
    """

    video: dict[str, Any] | None = None
    min_speech_ms: int | None = None
    interruption_deadline_ms: int | None = None
    max_audio_seconds: int | None = None
    extra_events: bool | None = None


class SessionSpec(OpenObject):
    type: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["audio", "text"]] | None = None
    audio: AudioSpec | None = None
    parley: ParleyExtras | None = None
    include: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    truncation: Any = None
    """`auto`, `disabled` or a retention_ratio object: any JSON here, the session checks it
    (its ConfigError names the field and what is wrong, and the rest of the update applies)."""
    model: str | None = None
    parallel_tool_calls: bool | None = None
    prompt: Any = None
    """OpenAI's stored prompt template `{"id", "version", "variables"}`: refused (the
    templates live on OpenAI's platform); null is none."""
    reasoning: Any = None
    tracing: Any = None
    """`auto`, an object (`group_id`, `metadata`, `workflow_name`) or null: echoed."""
    # beta spellings (and beta's own fields: `speed` at the top, `temperature`)
    speed: float | None = None
    temperature: float | None = None
    client_secret: Any = None
    max_response_output_tokens: int | Literal["inf"] | None = None
    modalities: list[Literal["audio", "text"]] | None = None
    voice: str | None = None
    turn_detection: TurnDetectionSpec | None = None
    input_audio_format: str | None = None
    output_audio_format: str | None = None
    input_audio_transcription: TranscriptionSpec | None = None
    input_audio_noise_reduction: NoiseReductionSpec | None = None


_EAGERNESS = ("low", "medium", "high", "auto")
_INTERRUPTION = ("always", "adaptive")


def turn_detection_patch(
    spec: TurnDetectionSpec | None, param: str, eid: str | None
) -> dict[str, Any] | None:
    if spec is None:
        return None  # manual turns: input_audio_buffer.commit + response.create
    if spec.interruption not in (None, *_INTERRUPTION):
        raise ProtocolError(
            "invalid_value",
            f"unknown interruption {spec.interruption!r}; use 'always' or 'adaptive'",
            eid,
            f"{param}.interruption",
        )
    if spec.type == "semantic_vad":
        if spec.eagerness not in (None, *_EAGERNESS):
            raise ProtocolError(
                "invalid_value",
                f"unknown eagerness {spec.eagerness!r}; use low, medium, high or auto",
                eid,
                f"{param}.eagerness",
            )
        knobs = spec.model_dump(
            include={
                "eagerness",
                "create_response",
                "interrupt_response",
                "idle_timeout_ms",
                "interruption",
            },
            exclude_none=True,
        )
        return {"type": "semantic_vad", **knobs}
    if spec.type != "server_vad":
        raise ProtocolError(
            "invalid_value",
            f"unknown turn detection type {spec.type!r}; use 'server_vad' or 'semantic_vad'",
            eid,
            f"{param}.type",
        )
    knobs = spec.model_dump(
        include={
            "threshold",
            "prefix_padding_ms",
            "silence_duration_ms",
            "create_response",
            "interrupt_response",
            "idle_timeout_ms",
            "interruption",
        },
        exclude_none=True,
    )
    return {"type": "server_vad", **knobs}


def audio_format(
    ga: AudioFormatSpec | None,
    beta: str | None,
    direction: Literal["input", "output"],
    eid: str | None,
) -> tuple[str, int] | None:
    """(format, rate) from the GA object or the beta string; None when neither is given."""
    if ga is None and beta is None:
        return None
    param = f"session.audio.{direction}.format" if ga else f"session.{direction}_audio_format"
    if ga is None:
        fmt = _BETA_FORMATS.get(beta or "")
        if fmt is None:
            raise ProtocolError(
                "invalid_value",
                f"unknown audio format {beta!r}; use pcm16, g711_ulaw or g711_alaw",
                eid,
                param,
            )
        return fmt, G711_RATE if fmt in G711_FORMATS else PCM_RATE
    if ga.type in G711_FORMATS:
        if ga.rate not in (None, G711_RATE):
            raise ProtocolError(
                "invalid_value", f"{ga.type} is always {G711_RATE} Hz", eid, f"{param}.rate"
            )
        return ga.type, G711_RATE
    if ga.type != "audio/pcm":
        raise ProtocolError(
            "invalid_value",
            f"unknown audio format {ga.type!r}; use audio/pcm, audio/pcmu or audio/pcma",
            eid,
            f"{param}.type",
        )
    # OpenAI takes only 24 kHz; Parley's resamplers take more, so other rates are allowed.
    rates = SUPPORTED_INPUT_RATES if direction == "input" else SUPPORTED_OUTPUT_RATES
    rate = PCM_RATE if ga.rate is None else ga.rate
    if rate not in rates:
        listed = ", ".join(str(r) for r in rates)
        raise ProtocolError(
            "invalid_value",
            f"unsupported {direction} rate {rate} Hz; use one of: {listed}",
            eid,
            f"{param}.rate",
        )
    return "audio/pcm", rate
