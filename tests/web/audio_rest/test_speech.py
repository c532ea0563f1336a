"""`/v1/audio/speech` through the official openai SDK: Piper's speech in each format decodes
(PyAV) and the transcription endpoint hears the words back."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai
import pytest

from loadtest.served import Served

from .conftest import KEY, SAID, SAID_HEARD, SAID_WORDS, decoded, heard, wav

RATES = {"wav": 24_000, "mp3": 24_000, "opus": 48_000, "aac": 24_000, "flac": 24_000}
"""Each format's decoded rate: OpenAI's 24 kHz (Opus always decodes at 48 kHz)."""


def hear_back(client: openai.OpenAI, data: bytes, name: str) -> str:
    return client.audio.transcriptions.create(
        file=(name, data), model="whisper-1", language="en"
    ).text


@pytest.mark.parametrize("form", ["wav", "mp3", "opus", "pcm"])
def test_speech_round_trips(client: openai.OpenAI, form: str) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts",
        voice="coral",
        input=SAID,
        response_format=form,  # type: ignore[arg-type]
    ) as response:
        assert response.headers.get("content-length") is None  # chunked: sent as made
        data = response.read()
    if form == "pcm":  # raw 24 kHz mono PCM16, as OpenAI documents it
        samples = np.frombuffer(data, "<i2")
        assert 1.5 < len(samples) / 24_000 < 6
        data, form = wav(samples.astype(np.int16), 24_000), "wav"
    else:
        rate, audio = decoded(data)
        assert rate == RATES[form] and 1.5 < len(audio) / rate < 6
    back = hear_back(client, data, f"speech.{form}")
    assert heard(back, SAID_WORDS, SAID_HEARD), back


def test_aac_and_flac_decode(client: openai.OpenAI) -> None:
    for form in ("aac", "flac"):
        data = client.audio.speech.create(
            model="tts-1", voice="onyx", input="Good morning.", response_format=form
        ).read()
        rate, audio = decoded(data)
        assert rate == 24_000 and len(audio) > 0.3 * rate


def test_sse_gives_deltas_then_done(server: Served) -> None:
    body = {"model": "gpt-4o-mini-tts", "input": SAID, "voice": "alloy", "stream_format": "sse"}
    with httpx.Client(timeout=60) as http:
        response = http.post(
            f"{server.http_url}/v1/audio/speech",
            headers={"Authorization": f"Bearer {KEY}"},
            json=body,
        )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert [e["type"] for e in events][-1] == "speech.audio.done"
    deltas = [e for e in events[:-1] if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(events) - 1 >= 1
    mp3 = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    rate, audio = decoded(mp3)
    assert rate == 24_000 and len(audio) > rate


def test_refusals(server: Served, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="must not be empty"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="  ")
    with pytest.raises(openai.BadRequestError, match="limit is 4096"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="word " * 1000)
    with pytest.raises(openai.BadRequestError, match="Supported values"):
        client.audio.speech.create(model="tts-1", voice="robot", input="Hi.")
    with pytest.raises(openai.BadRequestError, match="Supported values"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", response_format="ogg")  # type: ignore[arg-type]
    with (
        openai.OpenAI(
            base_url=f"{server.http_url}/v1", api_key="sk-wrong", max_retries=0
        ) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
