"""GPT-Live's session configuration (`session.start`), strict, and what it means in Parley.

GPT-Live (OpenAI's full-duplex voice API, `client.live` in the `openai` SDK) starts a
session with one `session.start` carrying its whole configuration; unknown fields are an
error, and voice, audio format and instructions cannot change afterwards. The fields are
those of the SDK's `SessionConfig` (openai/types/live/session_config.py in the SDK we pin).

Parley serves it with its own pipelines, which take turns: Parley's turn detection and
barge-in decide when the assistant speaks (there is no client control over it, as in
GPT-Live), with adaptive interruption (`turn_detection.interruption: "adaptive"`: a
backchannel or a noise over an answer holds it for a moment and lets it go on,
sessions/overlap_judge.py). `responses` delegation is served by Parley's own model (its
Thinker plays the backend's part, function tools and all: live_delegation.py); `decisions`
and hosted tools have no counterpart and are refused with a clear error rather than
silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sessions import ConfigError, SessionConfig

from ..g711 import PCMA, PCMU
from ..openai.client_events import AudioFormats
from .live_client_delegation import DELEGATE_TOOL

MAX_INPUT_ITEMS = 128
"""GPT-Live's bound on the history given at start."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LiveAudioFormat(_Strict):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
    rate: int = 24_000

    @model_validator(mode="after")
    def _rate(self) -> LiveAudioFormat:
        wanted = (16_000, 24_000) if self.type == "audio/pcm" else (8_000,)
        if self.rate not in wanted:
            raise ValueError(f"{self.type} is sent at {' or '.join(map(str, wanted))} Hz")
        return self


class LiveAudioOutput(_Strict):
    voice: str | dict[str, Any] | None = None


class LiveAudio(_Strict):
    format: LiveAudioFormat | None = None
    output: LiveAudioOutput | None = None


class LiveContentPart(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str


class LiveInitialItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["developer", "system", "user", "assistant"]
    content: list[LiveContentPart] = Field(min_length=1, max_length=1)


class LiveServerEventSelector(_Strict):
    """One server event a WebRTC front end may read: `{type}`, or for a Responses event
    `{type: "response.event", response_event}`."""

    type: str = Field(min_length=1)
    response_event: str | None = None

    @model_validator(mode="after")
    def _nested(self) -> LiveServerEventSelector:
        nested = self.type == "response.event"
        if nested and not self.response_event:
            raise ValueError("a response.event selector names its `response_event`")
        if not nested and self.response_event is not None:
            raise ValueError("`response_event` is only for type 'response.event'")
        return self


class LiveDataChannel(_Strict):
    """What an untrusted WebRTC front end may send and read on its data channel (each
    left out: everything; an empty list: nothing). Sidebands are not bound by it."""

    allowed_client_events: Literal["all"] | list[str] | None = None
    allowed_server_events: Literal["all"] | list[LiveServerEventSelector] | None = None


class LiveClient(_Strict):
    data_channel: LiveDataChannel


class LiveDelegation(_Strict):
    type: Literal["client", "responses", "decisions"]
    acknowledgement_delay_ms: int | None = None
    responses: dict[str, Any] | None = None
    decisions: dict[str, Any] | None = None


class LiveSessionConfig(_Strict):
    """The SDK's `SessionConfig`, field for field."""

    model: str
    audio: LiveAudio | None = None
    client: LiveClient | None = None
    delegation: LiveDelegation | None = None
    input: list[LiveInitialItem] | None = Field(default=None, max_length=MAX_INPUT_ITEMS)
    instructions: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    triggers: list[dict[str, Any]] | None = None

    @property
    def format(self) -> LiveAudioFormat:
        audio = self.audio
        if audio is not None and audio.format is not None:
            return audio.format
        return LiveAudioFormat(type="audio/pcm", rate=24_000)

    @property
    def voice(self) -> str | None:
        output = self.audio.output if self.audio is not None else None
        voice = output.voice if output is not None else None
        if isinstance(voice, dict):
            found = voice.get("id") or voice.get("name")
            return str(found) if found else None
        return voice


class LiveConfigError(Exception):
    """A `session.start` Parley cannot serve: `code` and `param` say what."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


def parse_live_config(body: Any) -> LiveSessionConfig:
    """The `session` of a `session.start`; LiveConfigError naming the first bad field."""
    try:
        return LiveSessionConfig.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in ("session", *first["loc"]))
        code = "unknown_parameter" if first["type"] == "extra_forbidden" else "invalid_value"
        if first["type"] == "missing":
            code = "missing_required_parameter"
        raise LiveConfigError(f"{where}: {first['msg']}", code, where) from exc


def check_delegation(delegation: LiveDelegation | None, where: str = "session") -> None:
    """Parley's own model plays the Responses backend's part, so `responses` delegation is
    served with function tools (live_delegation.py); `decisions`, and the Responses API's
    hosted tools, have no counterpart here."""
    if delegation is None or delegation.type == "client":
        return
    if delegation.type == "decisions":
        raise LiveConfigError(
            "delegation to 'decisions' is not available on this server; use 'client' or "
            "'responses'",
            "unsupported_value",
            f"{where}.delegation.type",
        )
    delegated_tools(delegation, where)


def delegated_tools(delegation: LiveDelegation | None, where: str = "session") -> dict[str, Any]:
    """The session settings (`tools`, `tool_choice`) that let Parley's model make the
    function calls of a `responses` delegation, or delegate to the app under an explicit
    `client` one (live_client_delegation.py); none for an omitted delegation."""
    if delegation is not None and delegation.type == "client":
        return {"tools": [dict(DELEGATE_TOOL)], "tool_choice": "auto"}
    if delegation is None or delegation.type != "responses":
        return {"tools": [], "tool_choice": "auto"}
    responses = delegation.responses or {}
    param = f"{where}.delegation.responses"
    tools = responses.get("tools") or []
    if not isinstance(tools, list):
        raise LiveConfigError("`tools` is a list of tools", "invalid_value", f"{param}.tools")
    found: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        at = f"{param}.tools.{index}"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise LiveConfigError(
                f"only function tools are served here (Parley's own model is the Responses "
                f"backend and hosts no tools); got {kind!r}",
                "unsupported_value",
                f"{at}.type",
            )
        unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if unknown:
            raise LiveConfigError(
                f"unknown field {sorted(unknown)[0]!r}", "unknown_parameter", f"{at}"
            )
        found.append(
            {
                "type": "function",
                "name": tool.get("name"),
                "description": tool.get("description") or "",
                "parameters": tool.get("parameters") or {},
            }
        )
    choice = responses.get("tool_choice", "auto")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = choice.get("name")
    if not isinstance(choice, str):
        raise LiveConfigError(
            "`tool_choice` is auto, none, required or {type: function, name}",
            "unsupported_value",
            f"{param}.tool_choice",
        )
    return {"tools": found, "tool_choice": choice}


def parley_config(
    live: LiveSessionConfig, base: SessionConfig
) -> tuple[SessionConfig, AudioFormats]:
    """The session Parley runs for `live` (on top of `base`, a key's own settings), and the
    connection's audio formats (one format both ways, as GPT-Live has it)."""
    check_delegation(live.delegation)
    patch: dict[str, Any] = dict(delegated_tools(live.delegation))
    if base.turn_detection is not None:  # Parley decides: a backchannel never cuts an answer
        patch["turn_detection"] = {"interruption": "adaptive"}
    if live.instructions and live.instructions.strip():
        patch["instructions"] = live.instructions
    if live.voice is not None:
        patch["voice"] = live.voice
    fmt = live.format
    try:
        config = base.updated(patch)
    except ConfigError as exc:
        text = str(exc)
        param = "session.instructions"
        if "voice" in text:
            param = "session.audio.output.voice"
        elif "tool" in text:
            param = "session.delegation.responses.tools"
        raise LiveConfigError(text, "invalid_value", param) from exc
    if fmt.type == "audio/pcm":
        formats = AudioFormats(
            input="audio/pcm", input_rate=fmt.rate, output="audio/pcm", output_rate=fmt.rate
        )
    else:
        coding = PCMU if fmt.type == "audio/pcmu" else PCMA
        formats = AudioFormats(input=coding, input_rate=8_000, output=coding, output_rate=8_000)
    return config, formats


def resolved(
    live: LiveSessionConfig, session_id: str, expires_at: int, *, media_format: bool = True
) -> dict[str, Any]:
    """The `session` of `session.started` / `session.closed`: the configuration as served,
    with the server's defaults filled in; without `audio.format` unless `media_format`
    (WebRTC and SIP negotiate their media, so only a WebSocket's session states one)."""
    fmt = live.format
    body: dict[str, Any] = live.model_dump(mode="json", exclude_none=True)
    body.update(
        id=session_id,
        expires_at=expires_at,
        status="active",
        model=live.model,
    )
    if media_format:
        audio = body.setdefault("audio", {})
        audio["format"] = {"type": fmt.type, "rate": fmt.rate}
    return body


NOT_FOR_SIP = frozenset({"client"})
"""What a SIP call's session cannot have: `client` is for a WebRTC session's frontend."""


def parse_accept_session(body: Any) -> LiveSessionConfig:
    """The `session` of `POST /v1/live/sessions/{id}/accept` (a SIP call answered as a
    GPT-Live session): `type: "live"` and the startup configuration, strict, without
    `audio.format` (SIP negotiates the call's media). LiveConfigError naming the field."""
    if not isinstance(body, dict):
        raise LiveConfigError("`session` must be an object", "invalid_type", "session")
    kind = body.get("type")
    if kind != "live":
        got = "is missing" if kind is None else f"is {kind!r}"
        code = "missing_required_parameter" if kind is None else "invalid_value"
        raise LiveConfigError(f"session.type must be 'live'; it {got}", code, "session.type")
    session = {name: value for name, value in body.items() if name != "type"}
    refused = sorted(NOT_FOR_SIP & set(session))
    if refused:
        param = f"session.{refused[0]}"
        raise LiveConfigError(f"{param} is not accepted for a SIP call", "unknown_parameter", param)
    audio = session.get("audio")
    if isinstance(audio, dict) and "format" in audio:
        raise LiveConfigError(
            "SIP negotiates the call's audio format: omit session.audio.format",
            "unknown_parameter",
            "session.audio.format",
        )
    return parse_live_config(session)
