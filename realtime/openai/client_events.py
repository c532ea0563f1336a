"""OpenAI Realtime client events: parsed, checked, and turned into session patches.

Clients of the OpenAI Realtime API (the browser SDKs, voice-agent platforms) send these
JSON events over the WebRTC data channel or a WebSocket. Parsing is strict about the
envelope (an unknown top-level parameter or a wrong type is an error that names the
parameter, as OpenAI does). Inside the session object every field of OpenAI's has its fate
(session_fields.py) and an unknown key is refused by name, the rest of the update applying;
items and `response` stay lenient. The `session.updated` reply shows what took effect.

Both the GA shapes and the beta spellings are accepted (`input_audio_format: "pcm16"`,
top-level `turn_detection`, `voice`, `modalities`); GA wins where both are given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias, cast

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from sessions import SessionConfig

from .client_items import ItemSpec
from .response_spec import max_tokens_value, tool_choice_value, tool_configs
from .session_fields import (
    fields_patch,
    mcp_tool_choice,
    not_in_transcription,
    unknown_parameters,
)
from .session_spec import G711_FORMATS, PCM_RATE, SessionSpec, audio_format, turn_detection_patch
from .session_spec import G711_RATE as G711_RATE
from .transcription_spec import transcription_patch
from .wire_values import ProtocolError as ProtocolError
from .wire_values import decode_base64 as decode_base64


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
        return self.input in G711_FORMATS or self.output in G711_FORMATS


def format_object(fmt: str, rate: int) -> dict[str, Any]:
    """The GA wire form of one format: PCM says its rate, G.711 is always 8 kHz."""
    return {"type": fmt, "rate": rate} if fmt == "audio/pcm" else {"type": fmt}


# --- models --------------------------------------------------------------------------------


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Event(_Closed):
    event_id: str | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"] = "session.update"
    session: SessionSpec
    _dropped: list[ProtocolError] = PrivateAttr(default_factory=list)
    """Values of the session object that had the wrong JSON type: left out, each an error
    of its own, so the rest of the update still applies."""


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


class ConversationItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"] = "conversation.item.retrieve"
    item_id: str


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
    | ConversationItemRetrieve
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
    "conversation.item.retrieve": ConversationItemRetrieve,
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
    if kind == "transcription_session.update":  # beta: a session.update of a transcription
        session = data.get("session")
        session = {**session, "type": "transcription"} if isinstance(session, dict) else session
        data, kind = {**data, "type": "session.update", "session": session}, "session.update"
    model = CLIENT_EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        known = ", ".join(CLIENT_EVENT_TYPES)
        raise ProtocolError(
            "unknown_event_type",
            f"unknown event type {kind!r}; Parley accepts: {known}",
            event_id,
            "type",
        )
    if model is SessionUpdate:
        return _session_update(data, event_id)
    try:
        return cast(ClientEvent, model.model_validate(data))
    except ValidationError as exc:
        raise _protocol_error(exc, kind, event_id) from None


_MAX_DROPPED = 32


def _session_update(data: dict[str, Any], event_id: str | None) -> SessionUpdate:
    """session.update, leaving out each value inside the session object that does not
    parse (`instructions: 5`): one error each, and the rest of the update stands."""
    dropped: list[ProtocolError] = []
    for _ in range(_MAX_DROPPED):
        try:
            event = SessionUpdate.model_validate(data)
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            smaller = _without_value(data, loc) if len(loc) > 1 and loc[0] == "session" else None
            if smaller is None:
                raise _protocol_error(exc, "session.update", event_id) from None
            dropped.append(_protocol_error(exc, "session.update", event_id))
            data = smaller
        else:
            event._dropped = dropped
            return event
    raise ProtocolError("invalid_value", "session.update: too many invalid values", event_id)


def _without_value(data: dict[str, Any], loc: tuple[int | str, ...]) -> dict[str, Any] | None:
    """`data` less the value at `loc`, cut at the innermost object key (a bad array
    element drops the whole array); None when there is no such key."""
    path = [part for part in loc if isinstance(part, str)]
    cut = next((i for i, part in enumerate(loc) if isinstance(part, int)), len(loc))
    path = [part for part in loc[:cut] if isinstance(part, str)]
    out = dict(data)
    node = out
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            return None
        node[key] = node = dict(child)
    if not path or path[-1] not in node:
        return None
    del node[path[-1]]
    return out


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
    update: SessionUpdate, formats: AudioFormats = AudioFormats(), transcribing: bool = False
) -> tuple[dict[str, Any], AudioFormats, list[ProtocolError]]:
    """What of the session object Parley can apply, and a ProtocolError for each value it
    cannot (each names its field); the rest applies without those.

    `formats` are the connection's current ones; the result keeps what the update does
    not mention. `transcribing`: the session is a transcription session already (else the
    update's `type` says). The session validates the patch's ranges (its ConfigError names
    the field); this checks only what the wire format itself decides.
    """
    spec, eid = update.session, update.event_id
    errors: list[ProtocolError] = [*update._dropped, *unknown_parameters(spec, eid)]
    patch, type_errors = transcription_patch(spec, eid)
    errors += type_errors
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
            patch["turn_detection"] = turn_detection_patch(
                audio_in.turn_detection, "session.audio.input.turn_detection", eid
            )
        elif "turn_detection" in spec.model_fields_set:
            patch["turn_detection"] = turn_detection_patch(
                spec.turn_detection, "session.turn_detection", eid
            )
    except ProtocolError as exc:
        errors.append(exc)
        td_set = False
    fields, field_errors = fields_patch(spec, eid)
    patch |= fields
    errors += field_errors
    if spec.tools is not None:
        mcp: list[dict[str, Any]] = []
        tools, tool_errors = tool_configs(spec.tools, "session.tools", eid, mcp)
        patch["tools"], patch["mcp_tools"] = tools, mcp
        errors += tool_errors
    if spec.tool_choice is not None:
        try:
            if (refused := mcp_tool_choice(spec.tool_choice, eid)) is not None:
                raise refused
            patch["tool_choice"] = tool_choice_value(spec.tool_choice, "session.tool_choice", eid)
        except ProtocolError as exc:
            errors.append(exc)
    cap_set = {"max_output_tokens", "max_response_output_tokens"} & spec.model_fields_set
    if cap_set:
        cap = (
            spec.max_output_tokens
            if "max_output_tokens" in cap_set
            else spec.max_response_output_tokens
        )
        try:
            patch["max_output_tokens"] = max_tokens_value(cap, "session.max_output_tokens", eid)
        except ProtocolError as exc:
            errors.append(exc)
    if spec.truncation is not None:
        patch["truncation"] = spec.truncation

    new = formats
    try:
        in_fmt = audio_format(
            audio_in.format if audio_in else None, spec.input_audio_format, "input", eid
        )
        if in_fmt is not None:
            new = replace(new, input=in_fmt[0], input_rate=in_fmt[1])
    except ProtocolError as exc:
        errors.append(exc)
    try:
        out_fmt = audio_format(
            audio_out.format if audio_out else None, spec.output_audio_format, "output", eid
        )
        if out_fmt is not None:
            new = replace(new, output=out_fmt[0], output_rate=out_fmt[1])
            patch["output_sample_rate"] = new.output_rate
    except ProtocolError as exc:
        errors.append(exc)
    if transcribing or spec.type == "transcription":  # no conversation fields, no output
        errors += not_in_transcription(spec, patch, eid)
        new = replace(new, output=formats.output, output_rate=formats.output_rate)

    extras = spec.parley
    if extras is not None:
        if extras.video is not None:
            patch["video"] = extras.video
        if extras.max_audio_seconds is not None:
            patch["max_audio_seconds"] = extras.max_audio_seconds
        if extras.extra_events is not None:
            patch["extra_events"] = extras.extra_events
        vad_knobs = extras.model_dump(
            include={"min_speech_ms", "interruption_deadline_ms"}, exclude_none=True
        )
        for knob, value in vad_knobs.items() if td_set else ():
            vad = patch.get("turn_detection", {})
            if vad is None:
                errors.append(
                    ProtocolError(
                        "invalid_value",
                        f"parley.{knob} needs voice activity turn detection, "
                        "but this update turns it off",
                        eid,
                        f"session.parley.{knob}",
                    )
                )
            else:
                patch["turn_detection"] = {**vad, knob: value}
    return patch, new, errors
