"""vLLM-Omni's video chat stream end to end: a real WebSocket client and the real server.

The app runs under uvicorn in process on 127.0.0.1, with a fake model engine behind a graph
file (quick answers, a tone as speech), so the engine's `requests` show what a query sent.
Tests of Parley's extras (ids, codes, statuses, resume) opt in with `EXTRAS`;
test_video_strict.py is a client that knows only vLLM-Omni.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import wave
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from loadtest.speech import speak, trim_silence
from realtime.auth import Authenticator
from realtime.openai.ga_events import source_id
from realtime.transports.websocket import connection
from realtime.video_chat import video_input, video_stream
from sessions.session import SessionLimits
from tests.fakes.fake_engine import FakeEngine
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from web.settings import Settings

Message = dict[str, Any]
EXTRAS: Message = {"parley": {"extras": True}}
"""What a session.config adds to opt in to Parley's extras."""


def engine_of(server: ServedApp) -> FakeEngine:
    pipeline: Any = server.services.pipeline
    engine = pipeline.engines["model"]
    assert isinstance(engine, FakeEngine)
    return engine


@dataclass
class Client:
    ws: ClientConnection
    messages: list[Message] = field(default_factory=list)

    async def send(self, **message: Any) -> None:
        await self.ws.send(json.dumps(message))

    async def next(self, within_s: float = 10.0) -> Message:
        async with asyncio.timeout(within_s):
            raw = await self.ws.recv()
        message: Message = json.loads(raw)
        self.messages.append(message)
        return message

    async def wait_for(self, kind: str, within_s: float = 10.0, **fields: Any) -> Message:
        """The next message of `kind` (with `fields`), keeping everything read on the way."""
        async with asyncio.timeout(within_s):
            while True:
                message = await self.next(within_s)
                if message["type"] == kind and all(message.get(k) == v for k, v in fields.items()):
                    return message

    async def error(self) -> str:
        return str((await self.wait_for("error"))["message"])

    async def closed_with(self) -> int | None:
        """Read until the server closes; its close code."""
        with suppress(ConnectionClosed):
            async with asyncio.timeout(10):
                while True:
                    await self.next()
        return self.ws.close_code

    def of(self, kind: str) -> list[Message]:
        return [m for m in self.messages if m["type"] == kind]

    def types(self) -> list[str]:
        return [m["type"] for m in self.messages]


OpenClient = Callable[..., AbstractAsyncContextManager[Client]]


@pytest.fixture
def graph(tmp_path: Path) -> str:
    return fake_graph_file(tmp_path, "audio_ms: 600, chunk_ms: 100, realtime_factor: 4.0")


@pytest.fixture
async def server(graph: str, redis_url: str) -> AsyncIterator[ServedApp]:
    settings = Settings(pipeline=graph, max_sessions=4)
    async with served_app(settings, redis_url) as served:
        yield served


@pytest.fixture
def open_client(server: ServedApp) -> OpenClient:
    @asynccontextmanager
    async def open_(
        config: Message | None = None, headers: dict[str, str] | None = None
    ) -> AsyncIterator[Client]:
        url = f"{server.ws_url}/v1/video/chat/stream"
        async with connect(url, additional_headers=headers, max_size=None) as ws:
            client = Client(ws)
            if config is not None:
                await client.send(type="session.config", **config)
            yield client

    return open_


def jpeg(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, format="JPEG")
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def wav_pcm(message: Message) -> tuple[int, int, int, npt.NDArray[np.int16]]:
    """rate, channels, sample width and samples of one response.audio.delta."""
    with wave.open(io.BytesIO(base64.b64decode(message["data"]))) as reader:
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
        return reader.getframerate(), reader.getnchannels(), reader.getsampwidth(), pcm


async def test_a_query_over_frames_and_speech_streams_text_and_wav_audio(
    open_client: OpenClient, server: ServedApp
) -> None:
    frames = [jpeg((220, 30, 30)), jpeg((30, 220, 30)), jpeg((30, 30, 220))]
    speech = trim_silence(speak("What colour is the box?"))
    async with open_client({"system_prompt": "You watch a camera.", **EXTRAS}) as client:
        for image in frames:
            await client.send(type="video.frame", data=b64(image))
        for start in range(0, len(speech), 1600):  # 100 ms chunks
            await client.send(type="audio.chunk", data=b64(speech[start : start + 1600].tobytes()))
        await client.send(type="video.query", text="What changed?")
        await client.wait_for("response.audio.done")
        types = client.types()
        assert types[:2] == ["session.created", "response.start"]
        created = client.messages[0]
        assert created["session_id"].startswith("sess_") and created["resume_token"]
        ids = [m["event_id"] for m in client.messages]  # every message has its own id
        assert all(ids) and len(set(ids)) == len(ids)
        assert types.index("response.text.done") < types.index("response.audio.done")
        deltas = "".join(m["delta"] for m in client.of("response.text.delta"))
        done = client.of("response.text.done")[0]
        assert done["text"] == deltas.strip() and done["status"] == "completed"
        assert done["text"].startswith("Hello there")
        audio = client.of("response.audio.delta")
        assert len(audio) >= 5
        for message in audio:
            assert message["format"] == "wav"
            rate, channels, width, pcm = wav_pcm(message)
            assert (rate, channels, width) == (24_000, 1, 2)
            assert 0 < len(pcm) <= 2_400  # a small delta: at most 100 ms
        assert int(np.abs(np.concatenate([wav_pcm(m)[3] for m in audio])).max()) > 4_000
        request = engine_of(server).requests[-1]
        assert [f.image for f in request.frames] == frames
        assert request.text == "What changed?"
        assert request.instructions == "You watch a camera."
        assert len(speech) - 320 < len(request.audio) <= len(speech)  # whole 20 ms frames
        assert np.array_equal(request.audio, speech[: len(request.audio)])
        assert request.output_sample_rate == 24_000 and not request.output_text_only


async def test_text_only_output_legacy_names_and_ping(
    open_client: OpenClient, server: ServedApp
) -> None:
    config = {"modalities": ["text"], "num_sample_frames": 2, "use_audio_in_video": False}
    async with open_client(config) as client:
        await client.send(type="ping")
        await client.wait_for("pong")
        for color in ((200, 0, 0), (0, 200, 0), (0, 0, 200)):
            await client.send(type="video.frame", data=b64(jpeg(color)))
        await client.send(type="audio.chunk", data=b64(np.full(8000, 500, np.int16).tobytes()))
        await client.send(type="video.query", text="Describe it.")
        done = await client.wait_for("response.text.done")
        assert set(done) == {"type", "text"}
        await client.send(type="ping")
        await client.wait_for("pong")
        assert not client.of("response.audio.delta") and not client.of("response.audio.done")
        request = engine_of(server).requests[-1]
        assert request.output_text_only
        assert len(request.frames) == 2  # num_sample_frames means num_frames
        assert len(request.audio) == 8000  # use_audio_in_video off: the audio is sent anyway


async def test_bad_settings_are_named_and_a_corrected_config_is_taken(
    open_client: OpenClient,
) -> None:
    async with open_client() as client:
        await client.send(type="session.config", num_frames=500)
        message = await client.error()
        assert "num_frames" in message and "between 1 and 128" in message
        await client.send(type="session.config", evs_threshold=1.5)
        message = await client.error()
        assert "frame_filter_threshold" in message and "between 0 and 1" in message
        await client.send(type="session.config", max_frames=0)
        assert "max_frames" in await client.error()
        await client.send(type="session.config", sampling_strategy="random")
        message = await client.error()
        assert message.startswith("Invalid session config: ") and "sampling_strategy" in message
        await client.send(type="session.config", sampling_strategy="latest_frames", colour="blue")
        await client.send(type="ping")  # the unknown setting was ignored, as by vLLM-Omni
        await client.wait_for("pong")
        await client.send(type="session.config")
        assert await client.error() == "Unknown type: session.config"
        assert [m["type"] for m in client.messages] == ["error"] * 4 + ["pong", "error"]


async def test_an_opted_in_client_gets_the_longer_texts_and_codes(
    open_client: OpenClient, server: ServedApp
) -> None:
    engine_of(server).fail_with = "the model fell over"
    async with open_client(EXTRAS) as client:
        await client.wait_for("session.created")
        await client.send(type="session.config")
        error = await client.wait_for("error")
        assert error["code"] == "config_fixed" and "configured already" in error["message"]
        await client.send(type="video.query", text="Anything?")
        error = await client.wait_for("error")
        assert error["code"] == "no_frames"
        assert error["message"].startswith("No frames buffered: send a video.frame")
        await client.send(type="video.frame", data=b64(jpeg((5, 5, 5))))
        await client.send(type="video.query", text="Anything now?")
        await client.wait_for("response.audio.done")
        failure = client.messages[client.types().index("response.start") + 1 :]
        assert [m["type"] for m in failure] == [
            "error",
            "response.text.done",
            "response.audio.done",
        ]  # one error for the failure, not the session's and the answer's
        assert failure[0]["code"] == "response_failed"
        assert "the model fell over" in failure[0]["message"]
        assert failure[1]["status"] == failure[2]["status"] == "failed"


async def test_the_first_message_must_be_session_config(
    open_client: OpenClient,
) -> None:
    async with open_client() as client:
        await client.send(type="ping")
        assert await client.error() == "Expected session.config, got: ping"
        assert await client.closed_with() == 1008


async def test_no_session_config_in_time_closes_the_connection(
    open_client: OpenClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(video_stream, "CONFIG_TIMEOUT_S", 0.3)
    async with open_client() as client:
        assert await client.error() == "Timeout waiting for session.config"
        assert await client.closed_with() == 1008


async def test_malformed_messages_get_errors_and_the_connection_stays_open(
    open_client: OpenClient,
) -> None:
    async with open_client({}) as client:
        cases: list[tuple[str | bytes, str]] = [  # vLLM-Omni's texts where it has them
            ("{not json", "Invalid JSON"),
            ("[1, 2]", "Messages must be JSON objects"),
            ('{"type": 5}', "Unknown type: 5"),
            ('{"type": "video.flame"}', "Unknown type: video.flame"),
            ('{"type": "audio.chunk", "data": 7}', "audio.chunk: data: Input should be"),
            ('{"type": "audio.chunk", "data": "@@@"}', "Invalid audio data"),
            ('{"type": "audio.chunk", "data": "AA=="}', "Invalid audio data: PCM16"),
            (b"\x00\x01", "Invalid JSON"),
        ]
        for raw, expected in cases:
            await client.ws.send(raw)
            assert (await client.error()).startswith(expected)
        await client.send(type="video.frame")  # no data: ignored, as by vLLM-Omni
        await client.send(type="ping")
        await client.wait_for("pong")


async def test_frames_too_large_or_not_images_are_refused(
    open_client: OpenClient,
) -> None:
    async with open_client({}) as client:
        await client.send(type="video.frame", data=b64(bytes(10 * 1024 * 1024 + 1)))
        assert "Frame too large" in await client.error()
        await client.send(type="video.frame", data=b64(b"GIF89a not really"))
        assert "Invalid image data" in await client.error()
        await client.send(type="video.frame", data="%%% not base64 %%%")
        assert "Invalid image data" in await client.error()
        await client.send(type="video.frame", data="data:image/jpeg;base64," + b64(jpeg((9, 9, 9))))
        await client.send(type="ping")
        await client.wait_for("pong")
        assert len(client.of("error")) == 3


async def test_a_message_over_16_mib_closes_with_1009(open_client: OpenClient) -> None:
    async with open_client({}) as client:
        with suppress(ConnectionClosed):
            await client.ws.send("x" * (16 * 1024 * 1024 + 1))
        assert await client.closed_with() == 1009


async def test_the_app_keeps_its_own_message_limit_behind_any_server(
    open_client: OpenClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "MAX_MESSAGE_BYTES", 64 * 1024)  # under uvicorn's
    async with open_client({}) as client:
        await client.send(type="ping")
        await client.wait_for("pong")
        await client.ws.send("y" * (64 * 1024 + 1))
        assert await client.closed_with() == 1009


async def test_audio_overflow_drops_the_oldest_audio_and_says_how_much(
    open_client: OpenClient, server: ServedApp
) -> None:
    mib = 1024 * 1024
    rng = np.random.default_rng(7)
    sent = rng.integers(-3000, 3000, size=5 * mib // 2, dtype=np.int16)  # 5 MiB
    async with open_client({"modalities": ["text"], **EXTRAS}) as client:
        await client.send(type="video.frame", data=b64(jpeg((5, 5, 5))))
        for start in range(0, len(sent), mib // 2):  # 1 MiB chunks
            await client.send(
                type="audio.chunk", data=b64(sent[start : start + mib // 2].tobytes())
            )
        warning = await client.wait_for("error")
        assert warning["code"] == "audio_buffer_overflow"
        kept = video_input.MAX_AUDIO_BYTES - video_input.MAX_AUDIO_BYTES % 640  # whole frames
        dropped = len(sent) * 2 - kept
        assert f"dropped the oldest {dropped // 32} ms ({dropped} bytes)" in warning["message"]
        await client.send(type="video.query", text="What did you hear?")
        await client.wait_for("response.text.done")
        assert len(client.of("error")) == 1  # everything dropped was reported at once
        request = engine_of(server).requests[-1]
        assert len(request.audio) * 2 == kept  # the newest 4 MiB, never the whole buffer
        assert np.array_equal(request.audio, sent[-len(request.audio) :])


async def test_a_second_query_cuts_the_first_answer_off(
    open_client: OpenClient, server: ServedApp
) -> None:
    engine = engine_of(server)
    engine.audio_ms = 5_000
    async with open_client(EXTRAS) as client:
        await client.send(type="video.frame", data=b64(jpeg((5, 5, 5))))
        await client.send(type="video.query", text="Tell me a long story.")
        await client.wait_for("response.audio.delta")
        engine.audio_ms = 300
        await client.send(type="video.query", text="Actually, just say hi.")
        cut = await client.wait_for("response.text.done")
        assert cut["status"] == "cancelled" and cut["text"].startswith("Hello there")
        assert (await client.next())["type"] == "response.audio.done"
        assert client.messages[-1]["status"] == "cancelled"
        assert (await client.next())["type"] == "response.start"  # no old audio in between
        done = await client.wait_for("response.text.done")
        assert done["status"] == "completed"
        await client.wait_for("response.audio.done", status="completed")
        first, second = engine.requests[-2:]
        assert first.request_id in engine.aborted
        assert second.text == "Actually, just say hi."


async def test_video_done_waits_for_the_answer_then_says_session_done(
    open_client: OpenClient,
) -> None:
    async with open_client(EXTRAS) as client:
        await client.send(type="video.frame", data=b64(jpeg((1, 2, 3))))
        await client.send(type="video.query", text="Anything there?")
        await client.send(type="video.done")
        assert await client.closed_with() == 1000
        types = client.types()
        assert types[-3:] == ["response.text.done", "response.audio.done", "session.done"]
        assert client.of("response.text.done")[0]["status"] == "completed"
        assert len(client.of("response.audio.delta")) == 6  # all of it: 600 ms in 100 ms


async def test_a_third_query_carries_the_whole_history(
    open_client: OpenClient, server: ServedApp
) -> None:
    questions = ["First question?", "Second question?", "Third question?"]
    async with open_client({"modalities": ["text"]}) as client:
        await client.send(type="video.frame", data=b64(jpeg((5, 5, 5))))
        for question in questions:
            await client.send(type="video.query", text=question)
            await client.wait_for("response.text.done")
        third = engine_of(server).requests[-1]
        assert third.text == "Third question?"
        assert [h.role for h in third.history] == ["user", "assistant", "user", "assistant"]
        assert [h.text for h in third.history if h.role == "user"] == questions[:2]
        assert all(h.text.startswith("Hello there") for h in third.history[1::2])


async def test_an_idle_session_says_why_and_closes(
    open_client: OpenClient, server: ServedApp
) -> None:
    assert server.services.manager is not None
    server.services.manager.limits = SessionLimits(idle_timeout_s=0.3, watchdog_interval_s=0.05)
    async with open_client(EXTRAS) as client:
        assert "idle_timeout" in await client.error()
        await client.wait_for("session.done")
        assert await client.closed_with() == 1000


async def test_an_api_key_is_required_when_configured(
    open_client: OpenClient, server: ServedApp
) -> None:
    server.services.auth = Authenticator("sk-video")
    for headers in (None, {"Authorization": "Bearer wrong"}):
        with pytest.raises(InvalidStatus) as refused:
            async with open_client({}, headers=headers):
                pass
        assert refused.value.response.status_code == 401  # as on /v1/realtime
        body = json.loads(refused.value.response.body)
        assert body["error"]["code"] == "invalid_api_key"
    async with open_client({}, headers={"Authorization": "Bearer sk-video"}) as client:
        await client.send(type="ping")
        await client.wait_for("pong")


TEXT_DELTAS = {"response.output_text.delta", "response.output_audio_transcript.delta"}


async def test_a_dropped_stream_resumes_with_the_missed_messages_exactly_once(
    open_client: OpenClient, server: ServedApp
) -> None:
    manager = server.services.manager
    assert manager is not None
    engine = engine_of(server)
    engine.text_interval_s = 0.1  # the answer's text streams for about a second
    async with open_client(EXTRAS) as first:
        created = await first.wait_for("session.created")
        session_id, token = created["session_id"], created["resume_token"]
        await first.send(type="video.frame", data=b64(jpeg((5, 5, 5))))
        await first.send(type="video.query", text="Tell me about it.")
        await first.wait_for("response.text.delta")
        seen = list(first.messages)
        last = seen[-1]["event_id"]
        await first.wait_for("response.text.delta")  # read, but as good as lost: replayed
        first.ws.transport.abort()  # the network drops: no close frame, nothing more read
    session = manager.get(session_id)
    async with asyncio.timeout(5):
        while session.responding:  # the server noticed and stopped the answer
            await asyncio.sleep(0.02)
    assert not session.closed

    for wrong in ({"resume_token": "wrong"}, {"session_id": "sess_nope"}):
        async with open_client() as intruder:
            resume = {"session_id": session_id, "resume_token": token, **wrong}
            await intruder.send(type="session.resume", last_event_id=last, **resume)
            assert "No resumable session" in await intruder.error()
            assert await intruder.closed_with() == 1008
    assert not session.closed

    engine.text_interval_s = 0.005
    async with open_client() as second:
        await second.send(
            type="session.resume", session_id=session_id, resume_token=token, last_event_id=last
        )
        await second.wait_for("response.audio.done", status="cancelled")
        replayed = list(second.messages)
        await session.event_log.flushed()
        logged = await session.event_log.replay()
        await second.send(type="video.query", text="And now?")
        done = await second.wait_for("response.text.done")
        assert done["status"] == "completed" and done["text"].startswith("Hello there")
        await second.wait_for("response.audio.done", status="completed")
        assert engine.requests[-1].text == "And now?"
        await second.send(type="video.done")
        assert await second.closed_with() == 1000

    # Only what the first connection had not read, in order: the rest of the cut answer.
    types = [m["type"] for m in replayed]
    assert types[-2:] == ["response.text.done", "response.audio.done"]
    assert set(types[:-2]) == {"response.text.delta"}  # no audio, no resume_gap error
    assert replayed[0] == first.messages[len(seen)]  # the delta the client did not count
    cut = replayed[-2]
    assert cut["status"] == "cancelled"
    deltas = [m["delta"] for m in seen + replayed if m["type"] == "response.text.delta"]
    assert cut["text"] == "".join(deltas).strip()  # no delta lost, none twice
    assert engine.text.startswith(cut["text"])
    ids = [m["event_id"] for m in seen + second.messages]
    assert len(set(ids)) == len(ids)
    # Exactly the logged events after the client's last one that make a message.
    logged_ids = [body["event_id"] for body in logged]
    after = logged[logged_ids.index(source_id(last)) + 1 :]
    expected = [b["event_id"] for b in after if b["type"] in TEXT_DELTAS | {"response.done"}]
    assert [source_id(m["event_id"]) for m in replayed[:-1]] == expected
    assert session.closed and session.close_reason == "client_done"
    assert server.services.video_streams.get(session_id) is None


async def test_a_resume_takes_over_from_a_connection_the_server_still_holds(
    open_client: OpenClient,
) -> None:
    async with open_client({"modalities": ["text"], **EXTRAS}) as first:
        created = await first.wait_for("session.created")
        await first.send(type="video.frame", data=b64(jpeg((5, 5, 5))))
        await first.send(type="video.query", text="Hi?")
        await first.wait_for("response.text.done")
        await first.send(type="session.resume", session_id="x", resume_token="y")
        assert "only as the first message" in await first.error()
        last = first.messages[-1]["event_id"]  # the error's, named after the answer's end
        async with open_client() as second:
            await second.send(
                type="session.resume",
                session_id=created["session_id"],
                resume_token=created["resume_token"],
                last_event_id=last,
            )
            assert await first.closed_with() == 1000
            await second.send(type="ping")
            pong = await second.wait_for("pong")
            assert second.messages == [pong]  # nothing missed, nothing sent twice
            assert pong["event_id"] != last and source_id(pong["event_id"]) == source_id(last)
            await second.send(type="video.query", text="Still there?")
            assert (await second.wait_for("response.text.done"))["status"] == "completed"
            await second.send(type="video.done")
            assert await second.closed_with() == 1000


async def test_a_dropped_stream_is_closed_after_the_grace_period(
    open_client: OpenClient, server: ServedApp
) -> None:
    manager = server.services.manager
    assert manager is not None
    manager.limits = SessionLimits(watchdog_interval_s=0.05)
    server.services.resume_grace_s = 0.3
    async with open_client(EXTRAS) as client:
        created = await client.wait_for("session.created")
        dropped = time.monotonic()
        client.ws.transport.abort()
    session = manager.get(created["session_id"])
    async with asyncio.timeout(5):
        while not session.closed:
            await asyncio.sleep(0.02)
    assert time.monotonic() - dropped >= 0.3 and session.close_reason == "client_gone"
    async with open_client() as late:
        await late.send(
            type="session.resume",
            session_id=created["session_id"],
            resume_token=created["resume_token"],
            last_event_id=created["event_id"],
        )
        assert "No resumable session" in await late.error()
        assert await late.closed_with() == 1008
