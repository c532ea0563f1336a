"""`/v1/audio/transcriptions` through the official openai SDK, as a client written for OpenAI
calls it: espeak-ng's speech uploaded as a WAV file, each response format read back."""

from __future__ import annotations

import httpx
import openai
import pytest

from loadtest.served import Served

from .conftest import KEY, SPOKEN_WORDS, heard, spoken_wav


def test_json_gives_the_words(client: openai.OpenAI) -> None:
    result = client.audio.transcriptions.create(
        file=("question.wav", spoken_wav(), "audio/wav"), model="whisper-1"
    )
    assert heard(result.text, SPOKEN_WORDS), result.text
    assert result.usage is not None and result.usage.type == "duration"


def test_verbose_json_gives_segments_language_duration_and_words(client: openai.OpenAI) -> None:
    result = client.audio.transcriptions.create(
        file=("question.wav", spoken_wav(), "audio/wav"),
        model="whisper-1",
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert heard(result.text, SPOKEN_WORDS), result.text
    assert result.language == "english"
    assert 1.5 < result.duration < 6.0
    assert result.segments and result.segments[0].id == 0
    assert 0.0 <= result.segments[0].start < result.segments[-1].end <= result.duration + 0.5
    assert result.words and heard(" ".join(w.word for w in result.words), SPOKEN_WORDS)


def test_text_srt_and_vtt(client: openai.OpenAI) -> None:
    upload = ("question.wav", spoken_wav(), "audio/wav")
    text = client.audio.transcriptions.create(
        file=upload, model="whisper-1", response_format="text", language="en"
    )
    assert isinstance(text, str) and heard(text, SPOKEN_WORDS), text
    vtt = client.audio.transcriptions.create(
        file=upload, model="whisper-1", response_format="vtt", language="en"
    )
    assert vtt.startswith("WEBVTT") and " --> " in vtt and heard(vtt, SPOKEN_WORDS), vtt
    srt = client.audio.transcriptions.create(
        file=upload, model="whisper-1", response_format="srt", language="en"
    )
    assert srt.startswith("1\n00:00:") and heard(srt, SPOKEN_WORDS), srt


def test_a_stream_gives_deltas_then_done(client: openai.OpenAI) -> None:
    stream = client.audio.transcriptions.create(
        file=("question.wav", spoken_wav(), "audio/wav"), model="whisper-1", stream=True
    )
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    deltas = "".join(event.delta for event in events[:-1])  # type: ignore[union-attr]
    done = events[-1]
    assert done.type == "transcript.text.done" and done.text == deltas.strip()
    assert heard(done.text, SPOKEN_WORDS), done.text


def error_of(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return dict(body["error"])


def test_refusals_are_openai_shaped(server: Served) -> None:
    url = f"{server.http_url}/v1/audio/transcriptions"
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(timeout=30) as http:
        no_file = http.post(url, headers=auth, files={"model": (None, "whisper-1")})
        assert no_file.status_code == 400
        assert error_of(no_file)["param"] == "file"
        garbage = http.post(
            url,
            headers=auth,
            data={"model": "whisper-1"},
            files={"file": ("a.mp3", b"\x00junk" * 500)},
        )
        assert garbage.status_code == 400
        assert error_of(garbage)["code"] == "invalid_file_format"
        upload = {"file": ("q.wav", spoken_wav(), "audio/wav")}
        bad_format = http.post(
            url, headers=auth, data={"model": "whisper-1", "response_format": "mp3"}, files=upload
        )
        assert bad_format.status_code == 400
        assert error_of(bad_format)["param"] == "response_format"
        too_big = http.post(
            url,
            headers=auth,
            data={"model": "whisper-1"},
            files={"file": ("big.wav", b"\x00" * (26 * 1024 * 1024))},
        )
        assert too_big.status_code == 413
        assert error_of(too_big)["code"] == "file_too_large"


def test_a_wrong_key_is_refused(server: Served) -> None:
    with (
        openai.OpenAI(
            base_url=f"{server.http_url}/v1", api_key="sk-wrong", max_retries=0
        ) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.audio.transcriptions.create(
            file=("q.wav", spoken_wav(), "audio/wav"), model="whisper-1"
        )
