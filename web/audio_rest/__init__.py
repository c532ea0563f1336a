"""OpenAI's audio REST endpoints on the served pipeline's own models.

`POST /v1/audio/transcriptions` (transcriptions.py) hears with the cascade's Whisper,
`POST /v1/audio/speech` (speech.py) speaks with its Piper voice; models.py says why they
are loaded in the server process and what a pipeline without them answers.
"""

from __future__ import annotations

from starlette.routing import Route

from .speech import speech
from .transcriptions import transcriptions

ROUTES = [
    Route("/v1/audio/transcriptions", transcriptions, methods=["POST"]),
    Route("/v1/audio/speech", speech, methods=["POST"]),
]

__all__ = ["ROUTES"]
