"""Session settings, validated as a whole before anything changes.

Field names follow OpenAI Realtime's session object where one exists. Every bounded
field says its range in its error message, so `ConfigError` names the field and the
range and the old settings stay in force.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.audio_format import OUTPUT_SAMPLE_RATE, SUPPORTED_OUTPUT_RATES
from pipeline.voices import OMNI_SPEAKERS, VOICE_NAMES, is_voice_name
from pipeline.whisper_languages import WHISPER_LANGUAGES

from .errors import ConfigError
from .mcp_config import MAX_MCP_SERVERS, McpToolConfig

__all__ = [
    "LOGPROBS",
    "SUPPORTED_OUTPUT_RATES",
    "InputTranscriptionConfig",
    "NoiseReductionConfig",
    "SessionConfig",
    "TruncationConfig",
]


def _between(lo: float, hi: float) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g}, got {value:g}")
        return value

    return check


Unit = Annotated[float, AfterValidator(_between(0.0, 1.0))]
PaddingMs = Annotated[int, AfterValidator(_between(0, 5_000))]
SilenceMs = Annotated[int, AfterValidator(_between(20, 10_000))]
MinSpeechMs = Annotated[int, AfterValidator(_between(20, 5_000))]
MaxFrames = Annotated[int, AfterValidator(_between(1, 256))]
NumFrames = Annotated[int, AfterValidator(_between(1, 128))]
AudioSeconds = Annotated[int, AfterValidator(_between(1, 3_600))]
IdleTimeoutMs = Annotated[int, AfterValidator(_between(1_000, 3_600_000))]
DeadlineMs = Annotated[int, AfterValidator(_between(100, 10_000))]
OutputTokens = Annotated[int, AfterValidator(_between(1, 4_096))]
Speed = Annotated[float, AfterValidator(_between(0.25, 1.5))]
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


Eagerness = Literal["low", "medium", "high", "auto"]

SEMANTIC_SILENCE_MS: dict[str, int] = {"low": 1200, "medium": 700, "auto": 700, "high": 350}
"""semantic_vad's end of turn on silence alone, by eagerness; the words then move it.

OpenAI's semantic_vad ends a turn when a model judges the user has finished. Parley waits
this long after the voice stops, unless the words recognised at the pause decide sooner
(turn_end.py: a turn that sounds finished ends as soon as they are known, one that breaks
off at "and" or "the" waits twice as long, at most 2.5 s). The windows bracket server_vad's
500 ms the way OpenAI describes eagerness: `low` lets the user think aloud (1.2 s covers
the hesitation pauses inside a sentence, 0.5-1 s), `medium`/`auto` (0.7 s) waits out most
such pauses, and `high` (350 ms) answers as soon as a short pause ends a phrase, at the
cost of cutting in on a mid-sentence breath.
"""


class TurnDetectionConfig(_Model):
    """Server VAD, with OpenAI Realtime's knobs plus `min_speech_ms` for barge-in.

    `semantic_vad` runs the same detector with `silence_duration_ms` set by `eagerness`
    (SEMANTIC_SILENCE_MS); server_vad has no eagerness.
    """

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: Unit = 0.5
    prefix_padding_ms: PaddingMs = 300
    silence_duration_ms: SilenceMs = 500
    min_speech_ms: MinSpeechMs = 200
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: Eagerness | None = None
    idle_timeout_ms: IdleTimeoutMs | None = None
    """After an answer has played, this long without speech commits the silence as a
    turn and answers it (`input_audio_buffer.timeout_triggered`); None: never."""
    interruption: Literal["always", "adaptive"] = "always"
    """What speech over an answer does (with `interrupt_response`). `always`: speech that
    lasts `min_speech_ms` cuts the answer (OpenAI's meaning). `adaptive`: the answer is
    held silent while the speech is judged (overlap_judge.py); a backchannel or a noise lets
    it go on where it stopped, anything more cuts it as `always` does."""
    interruption_deadline_ms: DeadlineMs = 1_000
    """`adaptive`: speech over an answer that is not judged within this much input audio
    from its first voiced frame counts as a real interruption. Why 1000 ms: the judge
    needs the words, which come when the voice stops plus ~80 ms (the pause) plus one
    recognition (Whisper base, ~230 ms on the 2-core bench machine): "yeah" (~350 ms
    voiced) is judged about 650 ms in, "okay" or "I see" about 750 ms, the longest voice
    still taken for a backchannel (700 ms) about 1000 ms. 600 ms would cut nearly every
    backchannel on that machine. The answer is silent from the first voiced frame
    whatever the deadline, so a longer one costs no talking over the user."""

    @model_validator(mode="before")
    @classmethod
    def _eagerness(cls, data: Any) -> Any:
        """semantic_vad: the silence window follows eagerness; server_vad: no eagerness."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        if data.get("type") == "semantic_vad":
            data["eagerness"] = data.get("eagerness") or "auto"
            if data["eagerness"] in SEMANTIC_SILENCE_MS:
                data["silence_duration_ms"] = SEMANTIC_SILENCE_MS[data["eagerness"]]
        else:
            data.pop("eagerness", None)
        return data

    @property
    def aggressiveness(self) -> int:
        """webrtcvad mode 0-3: a higher threshold asks for more certainty before speech."""
        return min(3, int(self.threshold * 4))


class VideoConfig(_Model):
    """The bounded frame cache and how frames are picked for a turn."""

    max_frames: MaxFrames = 50
    num_frames: NumFrames = 4
    sampling_strategy: Literal["uniform", "latest"] = "uniform"
    frame_window: Literal["turn", "cache"] = "turn"
    """`turn`: a turn's frames come from its own moment (frame_window.py); `cache`: from
    the whole cache (the rule of vLLM-Omni's video chat, for a client that asks for it)."""
    frame_filter: bool = True
    frame_filter_threshold: Unit = 0.95


class ToolConfig(_Model):
    """A function the model may call (OpenAI's function tool); the client runs it."""

    type: Literal["function"] = "function"
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _TOOL_NAME.fullmatch(value):
            raise ValueError("a tool name is 1-64 letters, digits, '_' or '-'")
        return value

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value and value.get("type", "object") != "object":
            raise ValueError("a tool's parameters are a JSON schema of type 'object'")
        return value


ToolChoiceConfig = str
"""`auto`, `none`, `required`, or the name of one of the tools (that one is called)."""


def check_tool_choice(choice: str, tools: tuple[ToolConfig, ...]) -> None:
    """Raise ValueError unless `choice` is a mode or names one of `tools`."""
    if choice in ("auto", "none", "required"):
        return
    if not any(tool.name == choice for tool in tools):
        names = ", ".join(tool.name for tool in tools) or "none defined"
        raise ValueError(f"{choice!r} is not auto, none, required or the name of a tool ({names})")


class TruncationLimits(_Model):
    """OpenAI's `token_limits` of a retention_ratio truncation."""

    post_instructions: int | None = Field(default=None, ge=1)
    """The conversation after the instructions is cut when it passes this many tokens
    (the engine's own limit, its context less the reply's budget, still holds)."""


class RetentionRatioTruncation(_Model):
    """OpenAI's `{"type": "retention_ratio", ...}`: a conversation that does not fit is
    cut down to `retention_ratio` of what may follow the instructions, so that later turns
    keep the same beginning (and the engine's cached KV of it) until it fills up again."""

    type: Literal["retention_ratio"] = "retention_ratio"
    retention_ratio: float
    token_limits: TruncationLimits | None = None


TruncationConfig = Literal["auto", "disabled"] | RetentionRatioTruncation
"""OpenAI Realtime's session `truncation`: what happens to a conversation longer than the
model's context (`auto`: its oldest items leave the model's context; `disabled`: the
response fails with `context_length_exceeded`; a retention ratio)."""


def truncation_config(value: Any) -> TruncationConfig:
    """`value` (the wire's string or object) as a TruncationConfig; ValueError naming the
    part that is wrong."""
    if isinstance(value, RetentionRatioTruncation) or value in ("auto", "disabled"):
        return cast(TruncationConfig, value)
    if isinstance(value, str):
        raise ValueError(f"must be 'auto', 'disabled' or a retention_ratio object, got {value!r}")
    if not isinstance(value, Mapping):
        raise ValueError("must be 'auto', 'disabled' or a retention_ratio object")
    if value.get("type") != "retention_ratio":
        raise ValueError(f"type must be 'retention_ratio', got {value.get('type')!r}")
    unknown = set(value) - {"type", "retention_ratio", "token_limits"}
    if unknown:
        raise ValueError(f"unknown setting {sorted(unknown)[0]!r}")
    ratio = value.get("retention_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, int | float):
        raise ValueError(f"retention_ratio must be a number from 0 to 1, got {ratio!r}")
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"retention_ratio must be between 0 and 1, got {ratio:g}")
    limits = value.get("token_limits")
    if limits is not None:
        if not isinstance(limits, Mapping) or set(limits) - {"post_instructions"}:
            raise ValueError("token_limits is an object with post_instructions only")
        cap = limits.get("post_instructions")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(
                f"token_limits.post_instructions must be a whole number of tokens of at "
                f"least 1, got {cap!r}"
            )
        limits = TruncationLimits(post_instructions=cap)
    return RetentionRatioTruncation(retention_ratio=float(ratio), token_limits=limits)


def truncation_object(value: TruncationConfig) -> str | dict[str, Any]:
    """The wire form of `value`, as `session.updated` echoes it."""
    if isinstance(value, str):
        return value
    return value.model_dump(mode="json", exclude_none=True)


DEFAULT_INSTRUCTIONS = (
    "You are a helpful voice assistant. Answer briefly, in the language the user speaks."
)
"""A session's instructions until the client sets its own. "In the language the user
speaks": without it the embedded SmolLM2 answered "What is the capital of France?" with "Le
Grand Paris ..." and kept to French for the rest of a conversation (key words in 3 of 20
answers in one conversation, against 17 of 20 with it; the same 20 questions asked alone:
16 and 17)."""


SessionType = Literal["realtime", "transcription"]
LOGPROBS = "item.input_audio_transcription.logprobs"


class InputTranscriptionConfig(_Model):
    """OpenAI's `audio.input.transcription`: the model, language and prompt a client asks
    to transcribe its audio with. The pipeline has one recogniser, so `model` is echoed,
    not obeyed; `language` (one of Whisper's codes) and `prompt` go with every recognition
    of the session's audio (recognition_hints.py): Whisper base uses both, tiny.en and
    pocketsphinx are English only. `keywords` join the prompt (Whisper's prompt is where
    words to expect go); `languages` is one language here (the recogniser is told one
    language or none), used when `language` is not given."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    keywords: tuple[str, ...] | None = None
    languages: tuple[str, ...] | None = Field(default=None, min_length=1, max_length=1)

    @field_validator("language")
    @classmethod
    def _known_language(cls, value: str | None) -> str | None:
        if value is not None:
            _whisper_language(value)
        return value

    @field_validator("languages")
    @classmethod
    def _known_languages(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for language in value or ():
            _whisper_language(language)
        return value


def _whisper_language(value: str) -> None:
    if value not in WHISPER_LANGUAGES:
        raise ValueError(f"{value!r} is not an ISO-639-1 code of a language Whisper knows")


class NoiseReductionConfig(_Model):
    """OpenAI's `audio.input.noise_reduction`: the session's input audio is cleaned by a
    noise suppressor before turn detection and recognition hear it (noise_reduction.py
    maps each type to its level); None (the default) leaves it as it is."""

    type: Literal["near_field", "far_field"] = "near_field"
    strength: Unit | None = None
    """OpenAI's 0-1 (None: 1, its default): scales the type's suppression level, so a
    weaker strength suppresses less (noise_reduction.py)."""


class ReasoningConfig(_Model):
    """OpenAI's `reasoning` of reasoning models, echoed: Parley's engines do not reason
    before they answer, so there is no reasoning for an effort to bound (docs:
    session-settings.md)."""

    effort: Literal["minimal", "low", "medium", "high", "xhigh"] | None = None


class TracingSettings(_Model):
    """OpenAI's tracing object (its Traces dashboard's names for the session), echoed:
    Parley sends no traces to OpenAI."""

    group_id: str | None = None
    metadata: Any = None
    workflow_name: str | None = None


class SessionConfig(_Model):
    type: SessionType = "realtime"
    """`transcription`: the session only transcribes the user's turns (OpenAI's
    transcription session): no responses, no audio out (transcription_session.py)."""
    input_transcription: InputTranscriptionConfig | None = None
    noise_reduction: NoiseReductionConfig | None = None
    include: tuple[Literal["item.input_audio_transcription.logprobs"], ...] = ()
    instructions: str = DEFAULT_INSTRUCTIONS
    output_modalities: tuple[Literal["audio", "text"], ...] = ("audio",)
    voice: str = "default"
    speed: Speed = 1.0
    """Speaking rate, OpenAI's `audio.output.speed`: 0.25-1.5, 1 is normal."""
    tools: tuple[ToolConfig, ...] = Field(default=(), max_length=MAX_TOOLS)
    tool_choice: ToolChoiceConfig = "auto"
    mcp_tools: tuple[McpToolConfig, ...] = Field(default=(), max_length=MAX_MCP_SERVERS)
    """The `{"type": "mcp"}` entries of OpenAI's `tools`: remote MCP servers (mcp_tools.py)."""
    max_output_tokens: OutputTokens | None = None
    """At most this many tokens per answer (OpenAI's `max_output_tokens`; None is `inf`)."""
    truncation: TruncationConfig = "auto"
    turn_detection: TurnDetectionConfig | None = TurnDetectionConfig()
    video: VideoConfig = VideoConfig()
    max_audio_seconds: AudioSeconds = 120
    output_sample_rate: Literal[8_000, 16_000, 24_000, 48_000] = OUTPUT_SAMPLE_RATE
    extra_events: bool = False
    """Send Parley's own server events (session.state_changed, .expiring, .closed) too."""
    model: str = "parley"
    """The model the client named: echoed, not obeyed (the pipeline answers)."""
    parallel_tool_calls: bool = True
    """False: a model's round of writing makes at most one call (response.py keeps the
    first and drops the rest; an engine that can is told too)."""
    reasoning: ReasoningConfig | None = None
    tracing: Literal["auto"] | TracingSettings | None = None
    """OpenAI's tracing (observability on OpenAI's platform): echoed, not acted on."""

    @model_validator(mode="before")
    @classmethod
    def _no_answers(cls, data: Any) -> Any:
        """A transcription session's turns are transcribed, never answered: its turn
        detection commits them with `create_response` off (transcription.py transcribes a
        turn no answer follows), and nothing is there to interrupt or time out after."""
        if not isinstance(data, Mapping) or data.get("type") != "transcription":
            return data
        td = data.get("turn_detection", TurnDetectionConfig())
        if isinstance(td, TurnDetectionConfig):
            td = td.model_dump()
        if isinstance(td, Mapping):
            quiet = {"create_response": False, "interrupt_response": False}
            data = {**data, "turn_detection": {**td, **quiet, "idle_timeout_ms": None}}
        return data

    @field_validator("voice")
    @classmethod
    def _voice(cls, value: str) -> str:
        if not is_voice_name(value):
            names = ", ".join((*VOICE_NAMES, *OMNI_SPEAKERS))
            raise ValueError(f"unknown voice {value!r}; Parley has: {names}")
        return value

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value: tuple[ToolConfig, ...]) -> tuple[ToolConfig, ...]:
        names = [tool.name for tool in value]
        if len(set(names)) != len(names):
            raise ValueError("two tools have the same name")
        return value

    @field_validator("truncation", mode="before")
    @classmethod
    def _truncation(cls, value: Any) -> TruncationConfig:
        return truncation_config(value)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: str, info: ValidationInfo) -> str:
        check_tool_choice(value, info.data.get("tools", ()))
        return value

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None = None) -> SessionConfig:
        """Validate `data`; raise ConfigError naming the first bad field."""
        try:
            return cls.model_validate(dict(data or {}))
        except ValidationError as exc:
            raise _config_error(exc) from None

    def updated(self, patch: Mapping[str, Any]) -> SessionConfig:
        """A new config with `patch` merged in (nested objects merge field by field).

        A null `turn_detection` switches to manual turns. Raises ConfigError and
        leaves `self` untouched when the result is invalid.
        """
        merged = _deep_merge(self.model_dump(), patch)
        for whole in ("truncation", "tracing"):  # one setting, not merged field by field
            if whole in patch:
                merged[whole] = patch[whole]
        td, was = patch.get("turn_detection"), self.turn_detection
        if (
            isinstance(td, Mapping)
            and td.get("type") == "server_vad"
            and was is not None
            and was.type == "semantic_vad"
            and "silence_duration_ms" not in td
        ):  # eagerness set the window; server_vad starts again from its own default
            merged["turn_detection"]["silence_duration_ms"] = _SERVER_SILENCE_MS
        return SessionConfig.parse(merged)

    @property
    def audio_output(self) -> bool:
        return "audio" in self.output_modalities


_SERVER_SILENCE_MS: int = TurnDetectionConfig.model_fields["silence_duration_ms"].default


def _deep_merge(base: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, dict):
            out[key] = _deep_merge(current, value)
        else:
            out[key] = value
    return out


def _config_error(exc: ValidationError) -> ConfigError:
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"]) or "session"
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown setting"
    return ConfigError(field, message)
