"""`POST /v1/audio/speech`: OpenAI's text-to-speech endpoint on the pipeline's Piper voice.

The audio is streamed as it is synthesised: a sentence is rendered (synthesis.py), encoded
(encoder.py) and sent while the next one renders, as a chunked response of the asked
`response_format`; or, with `stream_format: "sse"`, as OpenAI's server-sent events, each
`speech.audio.delta` carrying the next bytes of that format in base64, then
`speech.audio.done` with the usage. The admission slot is held until the last byte is sent
or the client goes away, which stops the synthesis at the next sentence.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from collections.abc import AsyncGenerator

from starlette.requests import Request
from starlette.responses import Response

from .blocking import off_loop
from .encoder import MEDIA_TYPES, SpeechEncoder
from .errors import AudioApiError
from .owned_stream import OwnedStream
from .service import audio_rest_of, authorise
from .speech_request import SpeechRequest, read_speech_request
from .synthesis import OUTPUT_RATE, Pcm, speak

log = logging.getLogger("parley.web.audio_rest")


async def speech(request: Request) -> Response:
    try:
        authorise(request)
        rest = audio_rest_of(request)
        models = rest.models(request)
        if models.names.voice_package is None:
            await models.voice()  # raises the 404 that names the pipeline
        async with contextlib.AsyncExitStack() as held:
            await held.enter_async_context(rest.speech.slot())
            asked = await read_speech_request(request)
            voice = await models.voice()
            audio = _encoded(speak(voice, asked.input, asked.speed), asked)
            if asked.stream_format == "sse":
                body = _events(audio)
                return OwnedStream(body, held.pop_all(), media_type="text/event-stream")
            headers = {"Content-Disposition": f"inline; filename=speech.{asked.response_format}"}
            media_type = MEDIA_TYPES[asked.response_format]
            return OwnedStream(audio, held.pop_all(), media_type=media_type, headers=headers)
    except AudioApiError as exc:
        return exc.response()


async def _encoded(
    pcm: AsyncGenerator[Pcm, None], asked: SpeechRequest
) -> AsyncGenerator[bytes, None]:
    """The speech in `asked.response_format`, a piece of bytes per sentence."""
    encoder = SpeechEncoder(asked.response_format, OUTPUT_RATE)
    try:
        async for piece in pcm:
            data = await off_loop(encoder.encode, piece)
            if data:
                yield data
        if tail := encoder.finish():
            yield tail
    finally:
        encoder.close()
        await pcm.aclose()


async def _events(audio: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """OpenAI's speech events around the encoded audio."""
    try:
        async for data in audio:
            delta = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield f"data: {json.dumps(delta)}\n\n".encode()
    finally:
        await audio.aclose()
    none = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}  # nothing is billed
    done = {"type": "speech.audio.done", "usage": none}
    yield f"data: {json.dumps(done)}\n\n".encode()
