"""What the audio endpoints share in a server process, and the checks every request passes.

One `AudioRest` per app (`app.state.audio_rest`): the two admission bounds and the models
of the pipeline being served. A request is checked in this order: the key (401), the
pipeline's models (503 while none is loaded, 404 when it has none for the endpoint), a
free slot (429), then its own fields (400/413).
"""

from __future__ import annotations

from starlette.requests import Request

from realtime.auth import AuthError

from ..services import services_of
from .admission import Admission
from .errors import AudioApiError
from .models import AudioModels, model_names

TRANSCRIPTION_SLOTS = 2
SPEECH_SLOTS = 2
"""Requests of each kind one server process runs at once (each mostly one CPU thread)."""


class AudioRest:
    def __init__(
        self, transcription_slots: int = TRANSCRIPTION_SLOTS, speech_slots: int = SPEECH_SLOTS
    ) -> None:
        self.transcriptions = Admission("transcription", transcription_slots)
        self.speech = Admission("speech", speech_slots)
        self._models: AudioModels | None = None

    def models(self, request: Request) -> AudioModels:
        """The served pipeline's models (not loaded yet: each loads when first asked for)."""
        services = services_of(request)
        if services.pipeline is None:
            raise AudioApiError(
                503,
                services.pipeline_error or f"pipeline {services.settings.pipeline!r} is not loaded",
                code="not_ready",
                kind="server_error",
            )
        if self._models is None:
            self._models = AudioModels(model_names(services.settings.pipeline, services.pipeline))
        return self._models


def audio_rest_of(request: Request) -> AudioRest:
    rest = getattr(request.app.state, "audio_rest", None)
    if not isinstance(rest, AudioRest):
        rest = request.app.state.audio_rest = AudioRest()
    return rest


def authorise(request: Request) -> None:
    """The server's API key, as the realtime endpoints take it (none needed on a server
    without one). An ephemeral secret is refused: it is minted to start one realtime call
    from a browser, not to spend the server's models on anything else."""
    try:
        grant = services_of(request).auth.check(request.headers.get("authorization"))
    except AuthError as exc:
        raise AudioApiError(401, str(exc), code="invalid_api_key") from None
    if grant.kind == "secret":
        raise AudioApiError(
            401,
            "an ephemeral secret starts realtime calls only; use the API key",
            code="invalid_api_key",
        )
