"""`POST /v1/audio/transcriptions`: OpenAI's transcription endpoint on the pipeline's Whisper.

The upload is decoded (PyAV), then Whisper runs over it a segment at a time on a worker
thread (recognition.py). Without `stream` the answer is the finished transcript in the
asked `response_format` (transcript_formats.py). With `stream=true` it is OpenAI's
server-sent events: a `transcript.text.delta` with each segment's words as Whisper decodes
them, then `transcript.text.done` with the whole text and the usage. OpenAI ignores
`stream` for whisper-1; Parley streams for every model name, as a client that asks for a
stream can read nothing else.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .blocking import off_loop
from .decode import decode_upload
from .errors import AudioApiError
from .owned_stream import OwnedStream
from .recognition import AudioInfo, Recognition, Segment
from .service import audio_rest_of, authorise
from .transcript_formats import joined, render, usage
from .transcription_request import read_transcription_request

log = logging.getLogger("parley.web.audio_rest")


async def transcriptions(request: Request) -> Response:
    try:
        authorise(request)
        rest = audio_rest_of(request)
        models = rest.models(request)
        if models.names.whisper is None:
            await models.whisper()  # raises the 404 that names the pipeline
        async with contextlib.AsyncExitStack() as held:
            await held.enter_async_context(rest.transcriptions.slot())
            asked = await read_transcription_request(request)
            model = await models.whisper()
            samples = await off_loop(decode_upload, asked.audio)
            recognition = Recognition(model, samples, asked.options)
            held.callback(recognition.close)
            info = await recognition.start()
            if asked.stream:
                body = _events(recognition, info)
                return OwnedStream(body, held.pop_all(), media_type="text/event-stream")
            segments = [segment async for segment in recognition.segments()]
            return render(asked.response_format, info, segments, asked.options.words)
    except AudioApiError as exc:
        return exc.response()


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _events(recognition: Recognition, info: AudioInfo) -> AsyncGenerator[bytes, None]:
    """OpenAI's transcription events, a delta per segment; an `error` event if Whisper fails
    partway (the status line has gone out by then)."""
    segments: list[Segment] = []
    try:
        async for segment in recognition.segments():
            segments.append(segment)
            delta = segment.text if len(segments) > 1 else segment.text.lstrip()
            if delta:
                yield _event({"type": "transcript.text.delta", "delta": delta, "logprobs": None})
    except Exception as exc:
        log.warning("a streamed transcription failed: %s: %s", type(exc).__name__, exc)
        error = {"message": str(exc), "type": "server_error", "param": None, "code": None}
        yield _event({"type": "error", "error": error})
        return
    done = {"type": "transcript.text.done", "text": joined(segments), "logprobs": None}
    yield _event({**done, "usage": usage(info)})
