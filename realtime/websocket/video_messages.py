"""vLLM-Omni's streaming video chat protocol (Qwen3-Omni), as typed messages.

Clients send JSON text messages with a `type`: `session.config` first, then `video.frame`,
`audio.chunk`, `video.query`, `video.done` and `ping`. The server answers with
`response.start`, `response.text.delta`/`.done`, `response.audio.delta`/`.done`,
`session.done`, `pong` and `error`.

Parley's resume extension, which a vLLM-Omni client may ignore: after `session.config` the
server sends `session.created {session_id, resume_token}`, and every server message has an
`event_id`. A client whose connection dropped reconnects and sends `session.resume
{session_id, resume_token, last_event_id}` as its first message instead of the config.

`parse_message` validates every client message and
turns each problem into a `MessageError` whose text names the message type and the field,
so the connection can say what was wrong and go on.

Decisions:

- `session.config` rejects unknown settings, as the session's own config does: a typo
  would otherwise be ignored without a word. The other messages ignore extra fields.
- The legacy names `num_sample_frames`, `evs_enabled` and `evs_threshold` mean
  `num_frames`, `enable_frame_filter` and `frame_filter_threshold`; when a message has
  both spellings, the canonical one wins.
- `sampling_params_list` is accepted and ignored (the server's graph sets sampling);
  `speaker` picks the session's voice.
- `response.text.done` and `response.audio.done` carry a `status`: `completed`,
  `cancelled` (a newer query cut the answer off) or `failed`; the text is what was sent
  as deltas.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from sessions import MaxFrames, NumFrames, Unit

Modality = Literal["text", "audio"]
Status = Literal["completed", "cancelled", "failed"]

LEGACY_NAMES = {
    "num_sample_frames": "num_frames",
    "evs_enabled": "enable_frame_filter",
    "evs_threshold": "frame_filter_threshold",
}


class MessageError(Exception):
    """A client message that cannot be used; the text says why, for the client."""

    def __init__(self, message: str, code: str = "invalid_message") -> None:
        super().__init__(message)
        self.code = code


# --- client -> server ----------------------------------------------------------------------


class _ClientMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SessionConfigMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["session.config"]
    model: str | None = None
    modalities: tuple[Modality, ...] = ("text", "audio")
    num_frames: NumFrames = 4
    max_frames: MaxFrames = 50
    system_prompt: str | None = None
    use_audio_in_video: bool = True
    enable_frame_filter: bool = True
    frame_filter_threshold: Unit = 0.95
    sampling_strategy: Literal["uniform", "latest"] = "uniform"
    sampling_params_list: list[Any] | None = None
    speaker: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for legacy, canonical in LEGACY_NAMES.items():
            if legacy in data:
                value = data.pop(legacy)
                data.setdefault(canonical, value)
        return data

    @field_validator("modalities")
    @classmethod
    def _some_output(cls, value: tuple[Modality, ...]) -> tuple[Modality, ...]:
        if not value:
            raise ValueError('must name at least one of "text" and "audio"')
        return tuple(dict.fromkeys(value))

    @property
    def audio_output(self) -> bool:
        return "audio" in self.modalities


class VideoFrameMessage(_ClientMessage):
    type: Literal["video.frame"]
    data: str
    """A base64 JPEG or PNG image (a `data:image/...;base64,` prefix is allowed)."""


class AudioChunkMessage(_ClientMessage):
    type: Literal["audio.chunk"]
    data: str
    """Base64 PCM16 little-endian mono at 16 kHz."""


class VideoQueryMessage(_ClientMessage):
    type: Literal["video.query"]
    text: str

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class VideoDoneMessage(_ClientMessage):
    type: Literal["video.done"]


class PingMessage(_ClientMessage):
    type: Literal["ping"]


class SessionResumeMessage(_ClientMessage):
    """Parley's own, instead of `session.config`: go on with a session after a drop."""

    type: Literal["session.resume"]
    session_id: str
    resume_token: str
    last_event_id: str | None = None
    """The `event_id` of the last message received; None: everything is sent again."""


ClientMessage = (
    SessionConfigMessage
    | SessionResumeMessage
    | VideoFrameMessage
    | AudioChunkMessage
    | VideoQueryMessage
    | VideoDoneMessage
    | PingMessage
)

_MODELS: dict[str, type[ClientMessage]] = {
    "session.config": SessionConfigMessage,
    "session.resume": SessionResumeMessage,
    "video.frame": VideoFrameMessage,
    "audio.chunk": AudioChunkMessage,
    "video.query": VideoQueryMessage,
    "video.done": VideoDoneMessage,
    "ping": PingMessage,
}


def parse_message(raw: str) -> ClientMessage:
    """One client message, validated; MessageError says what is wrong with it."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise MessageError(f"Malformed JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(data, dict):
        raise MessageError("A message must be a JSON object with a type")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise MessageError("A message needs a string type")
    model = _MODELS.get(kind)
    if model is None:
        known = ", ".join(_MODELS)
        raise MessageError(f"Unknown message type {kind!r}; expected one of: {known}")
    try:
        message = model.model_validate(data)
    except ValidationError as exc:
        raise MessageError(f"{kind}: {_describe(exc)}") from None
    return message


def _describe(exc: ValidationError) -> str:
    """The first problem, as `field: what is wrong`."""
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"]) or "message"
    text = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        text = "unknown setting"
    return f"{field}: {text}"


# --- server -> client ----------------------------------------------------------------------


class ServerMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    def wire(self) -> dict[str, Any]:
        """The JSON-ready message (fields that are not set are left out)."""
        return self.model_dump(exclude_none=True)


class SessionCreatedMessage(ServerMessage):
    """Parley's own: what a client needs to resume the session after a drop."""

    type: Literal["session.created"] = "session.created"
    session_id: str
    resume_token: str


class ResponseStart(ServerMessage):
    type: Literal["response.start"] = "response.start"


class ResponseTextDelta(ServerMessage):
    type: Literal["response.text.delta"] = "response.text.delta"
    delta: str


class ResponseTextDone(ServerMessage):
    type: Literal["response.text.done"] = "response.text.done"
    text: str
    status: Status = "completed"


class ResponseAudioDelta(ServerMessage):
    type: Literal["response.audio.delta"] = "response.audio.delta"
    data: str
    """A small, complete base64 WAV file: PCM16 mono at the session's output rate."""
    format: Literal["wav"] = "wav"


class ResponseAudioDone(ServerMessage):
    type: Literal["response.audio.done"] = "response.audio.done"
    status: Status = "completed"


class SessionDone(ServerMessage):
    type: Literal["session.done"] = "session.done"
    reason: str | None = None


class ErrorMessage(ServerMessage):
    type: Literal["error"] = "error"
    message: str
    code: str | None = None


class Pong(ServerMessage):
    type: Literal["pong"] = "pong"
