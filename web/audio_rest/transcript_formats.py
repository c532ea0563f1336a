"""A finished transcription in each `response_format` OpenAI's whisper-1 answers with.

`json`: `{"text", "usage"}`; `text`: the words as text/plain; `verbose_json`: task,
language (Whisper's name for it, lower case, as OpenAI writes it: "english"), duration,
text, segments (and `words` when word timestamps were asked for); `srt` and `vtt`: one cue
per segment. `usage` is OpenAI's duration form (`{"type": "duration", "seconds"}`), the
one it gives for whisper-1: there are no billed tokens here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

from starlette.responses import JSONResponse, PlainTextResponse, Response

from pipeline.whisper_languages import language_name

from .recognition import AudioInfo, Segment

ResponseFormat = Literal["json", "text", "verbose_json", "srt", "vtt"]
RESPONSE_FORMATS: tuple[str, ...] = get_args(ResponseFormat)


def joined(segments: Sequence[Segment]) -> str:
    return "".join(segment.text for segment in segments).strip()


def usage(info: AudioInfo) -> dict[str, Any]:
    return {"type": "duration", "seconds": math.ceil(info.duration)}


def render(
    form: ResponseFormat, info: AudioInfo, segments: Sequence[Segment], words: bool
) -> Response:
    text = joined(segments)
    if form == "text":
        return PlainTextResponse(text + "\n")
    if form == "srt":
        return PlainTextResponse(_cues(segments, ","), media_type="application/x-subrip")
    if form == "vtt":
        return PlainTextResponse(
            "WEBVTT\n\n" + _cues(segments, ".", numbered=False), media_type="text/vtt"
        )
    if form == "json":
        return JSONResponse({"text": text, "usage": usage(info)})
    body: dict[str, Any] = {
        "task": "transcribe",
        "language": language_name(info.language),
        "duration": round(info.duration, 2),
        "text": text,
        "segments": [_segment(segment) for segment in segments],
        "usage": usage(info),
    }
    if words:
        body["words"] = [dataclasses.asdict(w) for s in segments for w in s.words]
    return JSONResponse(body)


def _segment(segment: Segment) -> dict[str, Any]:
    fields = dataclasses.asdict(segment)
    fields.pop("words")
    fields["tokens"] = list(segment.tokens)
    return fields


def _cues(segments: Sequence[Segment], comma: str, *, numbered: bool = True) -> str:
    cues = []
    for number, segment in enumerate(segments, 1):
        span = f"{_clock(segment.start, comma)} --> {_clock(segment.end, comma)}"
        head = f"{number}\n{span}" if numbered else span
        cues.append(f"{head}\n{segment.text.strip()}\n")
    return "\n".join(cues)


def _clock(seconds: float, comma: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{comma}{millis:03d}"
