"""`POST /v1/audio/transcriptions`' multipart form, read and checked as OpenAI reads it.

The body is read no further than the upload limit (OpenAI's 25 MB, plus room for the other
fields): a larger Content-Length is refused before a byte is read, and a body that runs
past it while streaming is refused there (413 either way). Fields OpenAI defines and
Parley does not use (`include[]`, `chunking_strategy`, `known_speaker_names[]`, ...) are
accepted and ignored; the model name is any name (whisper-1, gpt-4o-transcribe, ...): the
pipeline's Whisper serves them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from .errors import AudioApiError, invalid, missing
from .recognition import ListenOptions
from .transcript_formats import RESPONSE_FORMATS, ResponseFormat

MAX_FILE_BYTES = 25 * 1024 * 1024
"""OpenAI's limit on an uploaded file."""
MAX_BODY_BYTES = MAX_FILE_BYTES + 256 * 1024
GRANULARITIES = ("segment", "word")


@dataclass(frozen=True, slots=True)
class TranscriptionRequest:
    audio: bytes
    model: str
    response_format: ResponseFormat
    stream: bool
    options: ListenOptions


async def read_transcription_request(request: Request) -> TranscriptionRequest:
    """The request's fields; AudioApiError (400, 413) for one OpenAI would refuse."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise AudioApiError(
            400,
            "send the audio as a multipart/form-data form with a 'file' part (as the "
            f"openai SDK does); got {kind or 'no Content-Type'!r}",
            code="invalid_content_type",
        )
    body = await _capped_body(request)

    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        async with Request(request.scope, replay).form(max_files=4, max_fields=64) as form:
            return await _fields(form)
    except (MultiPartException, HTTPException) as exc:
        detail = exc.detail if isinstance(exc, HTTPException) else exc.message
        raise AudioApiError(400, f"the multipart form could not be read: {detail}") from None


async def _capped_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large(int(declared))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _too_large(None)
    return bytes(body)


def _too_large(size: int | None) -> AudioApiError:
    got = f"{size} bytes" if size is not None else "larger"
    return AudioApiError(
        413,
        f"Maximum content size limit ({MAX_FILE_BYTES} bytes) exceeded ({got}).",
        param="file",
        code="file_too_large",
    )


async def _fields(form: FormData) -> TranscriptionRequest:
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise missing("file")
    audio = await upload.read()
    if len(audio) > MAX_FILE_BYTES:
        raise _too_large(len(audio))
    model = _text(form, "model")
    if not model:
        raise missing("model")
    response_format = _text(form, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise invalid(
            f"Invalid value: '{response_format}'. Supported values are: "
            + ", ".join(f"'{name}'" for name in RESPONSE_FORMATS)
            + ".",
            "response_format",
        )
    granularities = [str(g) for g in form.getlist("timestamp_granularities[]")]
    if unknown := [g for g in granularities if g not in GRANULARITIES]:
        raise invalid(
            f"Invalid value: '{unknown[0]}'. Supported values are: 'segment' and 'word'.",
            "timestamp_granularities",
        )
    options = ListenOptions(
        language=_text(form, "language") or None,
        prompt=_text(form, "prompt") or None,
        temperature=_temperature(_text(form, "temperature")),
        words="word" in granularities,
    )
    return TranscriptionRequest(
        audio=audio,
        model=model,
        response_format=cast(ResponseFormat, response_format),
        stream=_text(form, "stream").lower() == "true",
        options=options,
    )


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def _temperature(raw: str) -> float:
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise invalid(f"temperature must be a number from 0 to 1, got {raw!r}", "temperature")
    return value
