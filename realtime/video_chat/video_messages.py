"""vLLM-Omni's streaming video chat protocol (Qwen3-Omni), as typed messages.

Clients send JSON text messages with a `type`: `session.config` first, then `video.frame`,
`audio.chunk`, `video.query`, `video.done` and `ping`. The server answers with
`response.start`, `response.text.delta`/`.done`, `response.audio.delta`/`.done`,
`session.done`, `pong` and `error`, each with exactly vLLM-Omni's keys (video_wire.py).

Parley's extras, only for a client whose `session.config` has `"parley": {"extras": true}`:
`session.created {session_id, resume_token}` after the config, an `event_id` on every
server message, a `code` on errors, a `status` on the done messages (and done messages for
a cancelled answer), a `reason` on `session.done`, the longer error texts, and resume: a
client whose connection dropped reconnects and sends `session.resume {session_id,
resume_token, last_event_id}` as its first message instead of the config.

`parse_message` validates every client message and turns each problem into a
`MessageError`: its text names the message type and the field (an opted-in client gets
it), its `short` is vLLM-Omni's own wording (everyone else gets that).

Decisions, as vLLM-Omni's server:

- `session.config` ignores settings it does not know; the other messages ignore extra
  fields too.
- The legacy names `num_sample_frames`, `evs_enabled` and `evs_threshold` mean
  `num_frames`, `enable_frame_filter` and `frame_filter_threshold`; when a message has
  both spellings, the canonical one wins. `latest_frames` is Parley's `latest` sampling.
- A `video.query` may have empty text (a voice-only turn); its `audio_data` (base64 PCM16
  16 kHz mono) joins the audio sent since the last query. A `video.frame` without data is
  ignored.
- `sampling_params_list` ([thinker, talker, code2wav], vLLM sampling params): the
  thinker's `max_tokens` caps the answer where the session takes a cap; the rest is
  ignored (the server's graph sets sampling). `speaker` picks the session's voice.
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
STRATEGY_NAMES = {"latest_frames": "latest"}
"""vLLM-Omni's sampling strategy names that Parley spells otherwise."""


class MessageError(Exception):
    """A client message that cannot be used: the text says why (for an opted-in client),
    `short` as vLLM-Omni words it (for everyone else)."""

    def __init__(self, message: str, code: str = "invalid_message", short: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.short = short or message

    def text(self, extras: bool) -> str:
        return str(self) if extras else self.short


# --- client -> server ----------------------------------------------------------------------


class _ClientMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ParleyOptions(_ClientMessage):
    """`session.config`'s `parley`: what a client that knows Parley opts into."""

    extras: bool = False


class SessionConfigMessage(_ClientMessage):
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
    sampling_params_list: list[dict[str, Any]] | None = None
    speaker: str | None = None
    parley: ParleyOptions = ParleyOptions()

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
        strategy = data.get("sampling_strategy")
        if isinstance(strategy, str):
            data["sampling_strategy"] = STRATEGY_NAMES.get(strategy, strategy)
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

    @property
    def extras(self) -> bool:
        return self.parley.extras

    @property
    def max_output_tokens(self) -> int | None:
        """The thinker's `max_tokens` from `sampling_params_list`, if it has one."""
        if not self.sampling_params_list:
            return None
        cap = self.sampling_params_list[0].get("max_tokens")
        return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


class VideoFrameMessage(_ClientMessage):
    type: Literal["video.frame"]
    data: str = ""
    """A base64 JPEG or PNG image (a `data:image/...;base64,` prefix is allowed)."""


class AudioChunkMessage(_ClientMessage):
    type: Literal["audio.chunk"]
    data: str
    """Base64 PCM16 little-endian mono at 16 kHz."""


class VideoQueryMessage(_ClientMessage):
    type: Literal["video.query"]
    text: str = ""
    """The question; empty for a voice-only turn."""
    audio_data: str | None = None
    """Base64 PCM16 16 kHz mono, after the audio chunks sent since the last query."""


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
        raise MessageError(
            f"Invalid JSON: {exc.msg} at position {exc.pos}", short="Invalid JSON"
        ) from None
    if not isinstance(data, dict):
        raise MessageError(
            "Messages must be JSON objects with a type", short="Messages must be JSON objects"
        )
    kind = data.get("type")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        known = ", ".join(_MODELS)
        raise MessageError(
            f"Unknown type: {kind}; expected one of: {known}", short=f"Unknown type: {kind}"
        )
    try:
        message = model.model_validate(data)
    except ValidationError as exc:
        detail = f"{kind}: {_describe(exc)}"
        short = f"Invalid session config: {detail}" if kind == "session.config" else detail
        raise MessageError(detail, short=short) from None
    return message


def _describe(exc: ValidationError) -> str:
    """The first problem, as `field: what is wrong`."""
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"]) or "message"
    text = str(err["msg"]).removeprefix("Value error, ")
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
