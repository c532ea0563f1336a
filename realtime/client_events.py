"""OpenAI Realtime client events: parsed, checked, and turned into session patches.

Clients of the OpenAI Realtime API (the browser SDKs, voice-agent platforms) send these
JSON events over the WebRTC data channel or a WebSocket. Parsing is strict about the
envelope (an unknown top-level parameter or a wrong type is an error that names the
parameter, as OpenAI does) and lenient inside the objects OpenAI lets grow (the session,
items, `response`): fields Parley does not implement there are accepted and ignored, and
the `session.updated` reply shows what actually took effect.

Both the GA shapes and the beta spellings are accepted (`input_audio_format: "pcm16"`,
top-level `turn_detection`, `voice`, `modalities`); GA wins where both are given.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.audio_format import OUTPUT_SAMPLE_RATE, SUPPORTED_INPUT_RATES, SUPPORTED_OUTPUT_RATES
from sessions import InvalidRequestError, SessionConfig

PCM_RATE = OUTPUT_SAMPLE_RATE
G711_RATE = 8_000
_G711 = ("audio/pcmu", "audio/pcma")
_BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
_IMAGE_TYPES = ("image/jpeg", "image/png")


class ProtocolError(InvalidRequestError):
    """A client event Parley cannot use. The session reports it and goes on.

    `event_id` is the client's own id for the offending event, when it could be read, so
    the `error` event can point at it; `param` names the parameter at fault.
    """

    def __init__(
        self, code: str, message: str, event_id: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.event_id = event_id
        self.field = param


@dataclass(frozen=True, slots=True)
class AudioFormats:
    """The client's audio formats: the transport's business, not the session's.

    The session takes PCM16 at any supported rate and produces PCM16 at
    `SessionConfig.output_sample_rate`; G.711 coding and base64 are done at the edge.
    """

    input: str = "audio/pcm"
    input_rate: int = PCM_RATE
    output: str = "audio/pcm"
    output_rate: int = PCM_RATE

    @classmethod
    def for_config(cls, config: SessionConfig) -> AudioFormats:
        """PCM both ways, with the output at the rate the session already produces."""
        return cls(output_rate=config.output_sample_rate)

    @property
    def uses_g711(self) -> bool:
        return self.input in _G711 or self.output in _G711


def format_object(fmt: str, rate: int) -> dict[str, Any]:
    """The GA wire form of one format: PCM says its rate, G.711 is always 8 kHz."""
    return {"type": fmt, "rate": rate} if fmt == "audio/pcm" else {"type": fmt}


# --- models --------------------------------------------------------------------------------


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class AudioFormatSpec(_Open):
    type: str
    rate: int | None = None


class TurnDetectionSpec(_Open):
    type: str
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: str | None = None


class AudioInputSpec(_Open):
    format: AudioFormatSpec | None = None
    turn_detection: TurnDetectionSpec | None = None


class AudioOutputSpec(_Open):
    format: AudioFormatSpec | None = None
    voice: str | None = None


class AudioSpec(_Open):
    input: AudioInputSpec | None = None
    output: AudioOutputSpec | None = None


class ParleyExtras(_Open):
    """Parley's own settings, under the session's `parley` key.

    The session takes these four (`extra_events`: send Parley's own server events, such
    as `session.state_changed`, which OpenAI's API does not have; off by default, as an
    OpenAI client may reject them); a transport may read more of its own here (the WebRTC
    call's `video_fps_idle` and `video_fps_speaking`), so other keys are let through.
    """

    video: dict[str, Any] | None = None
    min_speech_ms: int | None = None
    max_audio_seconds: int | None = None
    extra_events: bool | None = None


class SessionSpec(_Open):
    type: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["audio", "text"]] | None = None
    audio: AudioSpec | None = None
    parley: ParleyExtras | None = None
    # beta spellings
    modalities: list[Literal["audio", "text"]] | None = None
    voice: str | None = None
    turn_detection: TurnDetectionSpec | None = None
    input_audio_format: str | None = None
    output_audio_format: str | None = None


class ContentPart(_Open):
    type: Literal["input_text", "input_image"]
    text: str | None = None
    image_url: str | None = None

    @model_validator(mode="after")
    def _has_payload(self) -> ContentPart:
        needed = "text" if self.type == "input_text" else "image_url"
        if getattr(self, needed) is None:
            raise ValueError(f"an {self.type} part needs '{needed}'")
        return self

    def image_bytes(self) -> bytes:
        """Decode an inline `data:image/jpeg;base64,...` URL (JPEG or PNG)."""
        url = self.image_url or ""
        header, comma, payload = url.partition(",")
        media = header.removeprefix("data:").removesuffix(";base64")
        if not comma or not header.startswith("data:") or not header.endswith(";base64"):
            raise ProtocolError(
                "invalid_value",
                "image_url must be an inline data URL (data:image/jpeg;base64,...); "
                "Parley does not fetch images",
                param="item.content.image_url",
            )
        if media not in _IMAGE_TYPES:
            raise ProtocolError(
                "invalid_value",
                f"image type {media!r} is not supported; send image/jpeg or image/png",
                param="item.content.image_url",
            )
        return decode_base64(payload, "item.content.image_url")


class ItemSpec(_Open):
    id: str | None = None
    type: Literal["message"] = "message"
    role: Literal["user", "system"]
    content: list[ContentPart] = Field(min_length=1)


class _Event(_Closed):
    event_id: str | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"] = "session.update"
    session: SessionSpec


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"] = "input_audio_buffer.append"
    audio: str

    def pcm(self) -> bytes:
        return decode_base64(self.audio, "audio")


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"] = "input_audio_buffer.commit"


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"] = "input_audio_buffer.clear"


class ConversationItemCreate(_Event):
    type: Literal["conversation.item.create"] = "conversation.item.create"
    previous_item_id: str | None = None
    item: ItemSpec


class ConversationItemTruncate(_Event):
    type: Literal["conversation.item.truncate"] = "conversation.item.truncate"
    item_id: str
    content_index: int = Field(default=0, ge=0)
    audio_end_ms: int = Field(ge=0)


class ConversationItemDelete(_Event):
    type: Literal["conversation.item.delete"] = "conversation.item.delete"
    item_id: str


class ResponseCreate(_Event):
    type: Literal["response.create"] = "response.create"
    response: dict[str, Any] | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"] = "response.cancel"
    response_id: str | None = None


class OutputAudioBufferClear(_Event):
    type: Literal["output_audio_buffer.clear"] = "output_audio_buffer.clear"


ClientEvent: TypeAlias = (
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemTruncate
    | ConversationItemDelete
    | ResponseCreate
    | ResponseCancel
    | OutputAudioBufferClear
)

CLIENT_EVENT_TYPES: dict[str, type[_Event]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": InputAudioBufferAppend,
    "input_audio_buffer.commit": InputAudioBufferCommit,
    "input_audio_buffer.clear": InputAudioBufferClear,
    "conversation.item.create": ConversationItemCreate,
    "conversation.item.truncate": ConversationItemTruncate,
    "conversation.item.delete": ConversationItemDelete,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
    "output_audio_buffer.clear": OutputAudioBufferClear,
}


# --- parsing -------------------------------------------------------------------------------


def parse_client_event(raw: str | bytes) -> ClientEvent:
    """One data-channel or WebSocket message -> a typed event, or ProtocolError."""
    try:
        data = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise ProtocolError("invalid_json", f"the message is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(
            "invalid_event", f"a client event is a JSON object, not {_json_kind(data)}"
        )
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if kind is None:
        raise ProtocolError(
            "missing_required_parameter", "the event has no 'type'", event_id, "type"
        )
    model = CLIENT_EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        known = ", ".join(CLIENT_EVENT_TYPES)
        raise ProtocolError(
            "unknown_event_type",
            f"unknown event type {kind!r}; Parley accepts: {known}",
            event_id,
            "type",
        )
    try:
        return cast(ClientEvent, model.model_validate(data))
    except ValidationError as exc:
        raise _protocol_error(exc, kind, event_id) from None


def _json_kind(value: object) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number"}
    return "null" if value is None else kinds.get(type(value), "a number")


def _protocol_error(exc: ValidationError, kind: str, event_id: str | None) -> ProtocolError:
    """The first validation problem, in words that name the parameter and what was sent."""
    err = exc.errors()[0]
    param = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in err["loc"]
    ).lstrip(".")
    problem = str(err["msg"]).removeprefix("Value error, ")
    sent = repr(err.get("input"))
    sent = sent if len(sent) <= 60 else sent[:57] + "..."
    etype = err["type"]
    if etype == "missing":
        return ProtocolError(
            "missing_required_parameter", f"{kind}: missing '{param}'", event_id, param
        )
    if etype == "extra_forbidden":
        return ProtocolError(
            "unknown_parameter", f"{kind}: unknown parameter '{param}'", event_id, param
        )
    if etype in _JSON_TYPES:
        return ProtocolError(
            "invalid_type",
            f"{kind}: '{param}' must be {_JSON_TYPES[etype]}, got {sent}",
            event_id,
            param,
        )
    message = f"{kind}: '{param}': {problem[:1].lower()}{problem[1:]}, got {sent}"
    return ProtocolError("invalid_value", message, event_id, param)


_JSON_TYPES = {
    "model_type": "an object",
    "dict_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "an array",
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
}
"""Pydantic's type errors in JSON's words: the client wrote JSON, not Python."""


def decode_base64(payload: str, param: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(
            "invalid_value", f"'{param}' is not valid base64", param=param
        ) from None


# --- session.update -> SessionConfig patch -------------------------------------------------


def session_patch(
    update: SessionUpdate, formats: AudioFormats = AudioFormats()
) -> tuple[dict[str, Any], AudioFormats]:
    """The GA or beta session object -> a patch for `SessionConfig.updated()`, and formats.

    All or nothing: the first value Parley cannot use is raised (a session being created
    should not start on half its settings). `session.update` uses `partial_session_patch`.
    """
    patch, new, errors = partial_session_patch(update, formats)
    if errors:
        raise errors[0]
    return patch, new


def partial_session_patch(
    update: SessionUpdate, formats: AudioFormats = AudioFormats()
) -> tuple[dict[str, Any], AudioFormats, list[ProtocolError]]:
    """What of the session object Parley can apply, and a ProtocolError for each value it
    cannot (each names its field); the rest applies without those.

    `formats` are the connection's current ones; the result keeps what the update does
    not mention. The session validates the patch's ranges (its ConfigError names the
    field); this checks only what the wire format itself decides.
    """
    spec, eid = update.session, update.event_id
    patch: dict[str, Any] = {}
    errors: list[ProtocolError] = []
    if spec.type not in (None, "realtime"):
        errors.append(
            ProtocolError(
                "unsupported",
                f"session type {spec.type!r} is not supported; use 'realtime'",
                eid,
                "session.type",
            )
        )
    if spec.instructions is not None:
        patch["instructions"] = spec.instructions
    modalities = spec.output_modalities if spec.output_modalities is not None else spec.modalities
    if modalities is not None:
        if not modalities:
            errors.append(
                ProtocolError(
                    "invalid_value",
                    "output_modalities must name 'audio' or 'text'",
                    eid,
                    "session.output_modalities",
                )
            )
        else:
            # Audio output always carries its transcript, so beta's ["text", "audio"] is audio.
            patch["output_modalities"] = ["audio"] if "audio" in modalities else ["text"]

    audio_in = spec.audio.input if spec.audio else None
    audio_out = spec.audio.output if spec.audio else None
    td_set = True
    try:
        if audio_in is not None and "turn_detection" in audio_in.model_fields_set:
            patch["turn_detection"] = _turn_detection(
                audio_in.turn_detection, "session.audio.input.turn_detection", eid
            )
        elif "turn_detection" in spec.model_fields_set:
            patch["turn_detection"] = _turn_detection(
                spec.turn_detection, "session.turn_detection", eid
            )
    except ProtocolError as exc:
        errors.append(exc)
        td_set = False
    voice = audio_out.voice if audio_out and audio_out.voice is not None else spec.voice
    if voice is not None:
        patch["voice"] = voice

    new = formats
    try:
        in_fmt = _format(
            audio_in.format if audio_in else None, spec.input_audio_format, "input", eid
        )
        if in_fmt is not None:
            new = replace(new, input=in_fmt[0], input_rate=in_fmt[1])
    except ProtocolError as exc:
        errors.append(exc)
    try:
        out_fmt = _format(
            audio_out.format if audio_out else None, spec.output_audio_format, "output", eid
        )
        if out_fmt is not None:
            new = replace(new, output=out_fmt[0], output_rate=out_fmt[1])
            patch["output_sample_rate"] = new.output_rate
    except ProtocolError as exc:
        errors.append(exc)

    extras = spec.parley
    if extras is not None:
        if extras.video is not None:
            patch["video"] = extras.video
        if extras.max_audio_seconds is not None:
            patch["max_audio_seconds"] = extras.max_audio_seconds
        if extras.extra_events is not None:
            patch["extra_events"] = extras.extra_events
        if extras.min_speech_ms is not None and td_set:
            vad = patch.get("turn_detection", {})
            if vad is None:
                errors.append(
                    ProtocolError(
                        "invalid_value",
                        "parley.min_speech_ms needs voice activity turn detection, "
                        "but this update turns it off",
                        eid,
                        "session.parley.min_speech_ms",
                    )
                )
            else:
                patch["turn_detection"] = {**vad, "min_speech_ms": extras.min_speech_ms}
    return patch, new, errors


_EAGERNESS = ("low", "medium", "high", "auto")


def _turn_detection(
    spec: TurnDetectionSpec | None, param: str, eid: str | None
) -> dict[str, Any] | None:
    if spec is None:
        return None  # manual turns: input_audio_buffer.commit + response.create
    if spec.type == "semantic_vad":
        if spec.eagerness not in (None, *_EAGERNESS):
            raise ProtocolError(
                "invalid_value",
                f"unknown eagerness {spec.eagerness!r}; use low, medium, high or auto",
                eid,
                f"{param}.eagerness",
            )
        knobs = spec.model_dump(
            include={"eagerness", "create_response", "interrupt_response"}, exclude_none=True
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
        },
        exclude_none=True,
    )
    return {"type": "server_vad", **knobs}


def _format(
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
        return fmt, G711_RATE if fmt in _G711 else PCM_RATE
    if ga.type in _G711:
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
