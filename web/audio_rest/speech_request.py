"""`POST /v1/audio/speech`' JSON body, read and checked as OpenAI checks it.

Honoured: `input` (1 to 4096 characters, OpenAI's limit), `voice`, `response_format`
(mp3 by default), `speed` (0.25-4.0) and `stream_format` (`audio`, or `sse` for
`speech.audio.delta` events). `model` must be given and may be any name (tts-1,
gpt-4o-mini-tts, ...): the pipeline's Piper voice serves them all. `instructions` is
accepted and ignored: Piper takes no direction on tone. Every voice name OpenAI lists (and
Parley's own voice names) is accepted and spoken with the pipeline's Piper voice; a custom
voice object (`{"id": ...}`) is spoken with it too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal, cast

from starlette.requests import Request

from pipeline.voices import VOICE_NAMES

from .encoder import SPEECH_FORMATS, SpeechFormat
from .errors import AudioApiError, invalid, missing

MAX_INPUT_CHARS = 4096
MAX_BODY_BYTES = 64 * 1024
MIN_SPEED, MAX_SPEED = 0.25, 4.0
OPENAI_TTS_VOICES = (
    "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable",
    "marin", "nova", "onyx", "sage", "shimmer", "verse",
)  # fmt: skip
"""Every voice OpenAI's speech API lists."""
VOICES = frozenset({*OPENAI_TTS_VOICES, *VOICE_NAMES, "default"})
StreamFormat = Literal["audio", "sse"]


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    model: str
    input: str
    voice: str
    response_format: SpeechFormat
    speed: float
    stream_format: StreamFormat


async def read_speech_request(request: Request) -> SpeechRequest:
    """The request's fields; AudioApiError (400, 413) for one OpenAI would refuse."""
    body = await _json_body(request)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise missing("model")
    text = body.get("input")
    if not isinstance(text, str):
        raise missing("input")
    if not text.strip():
        raise invalid("input must not be empty", "input", "empty_input")
    if len(text) > MAX_INPUT_CHARS:
        raise invalid(
            f"input is {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
            "input",
            "string_above_max_length",
        )
    return SpeechRequest(
        model=model,
        input=text,
        voice=_voice(body.get("voice")),
        response_format=cast(SpeechFormat, _choice(body, "response_format", SPEECH_FORMATS, "mp3")),
        speed=_speed(body.get("speed", 1.0)),
        stream_format=cast(StreamFormat, _choice(body, "stream_format", ("audio", "sse"), "audio")),
    )


async def _json_body(request: Request) -> dict[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise AudioApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise AudioApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise AudioApiError(400, "the body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise AudioApiError(400, "the body must be a JSON object", code="invalid_type")
    return body


def _voice(value: Any) -> str:
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        return "default"  # a custom voice: spoken with the pipeline's voice
    if not isinstance(value, str) or not value:
        raise missing("voice")
    if value.strip().lower() not in VOICES:
        names = ", ".join(f"'{name}'" for name in sorted(VOICES - {"default"}))
        raise invalid(f"Invalid value: '{value}'. Supported values are: {names}.", "voice")
    return value.strip().lower()


def _choice(body: dict[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = body.get(name)
    if value is None:
        return default
    if value not in allowed:
        names = ", ".join(f"'{a}'" for a in allowed)
        raise invalid(f"Invalid value: '{value}'. Supported values are: {names}.", name)
    return str(value)


def _speed(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    speed = float(value) if ok else math.nan
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise invalid(
            f"speed must be a number from {MIN_SPEED} to {MAX_SPEED}, got {value!r}", "speed"
        )
    return speed
