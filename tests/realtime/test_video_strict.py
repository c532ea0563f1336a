"""A client written for vLLM-Omni's video chat stream, strict about what it reads.

It knows vLLM-Omni's server only (vllm_omni/entrypoints/openai/serving_video_stream.py):
each message must have exactly that server's keys, be written as Starlette's `send_json`
writes it, and come in its order: `response.start`, text deltas, `response.text.done`
before the first audio delta, audio deltas, `response.audio.done`; nothing more for an
answer a newer query cut off; the error about a message is the next message.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from sessions import SessionConfig
from sessions.session import SessionLimits
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.test_video_stream import b64, engine_of, jpeg
from web.settings import Settings

Message = dict[str, Any]

VLLM_OMNI_KEYS = {
    "response.start": {"type"},
    "response.text.delta": {"type", "delta"},
    "response.text.done": {"type", "text"},
    "response.audio.delta": {"type", "data", "format"},
    "response.audio.done": {"type"},
    "session.done": {"type"},
    "pong": {"type"},
    "error": {"type", "message"},
}
ANSWER = [
    "response.start",
    "response.text.delta",
    "response.text.done",
    "response.audio.delta",
    "response.audio.done",
]
"""An answer's message types, each run of deltas as one."""


@dataclass
class StrictClient:
    ws: ClientConnection
    messages: list[Message] = field(default_factory=list)

    async def send(self, **message: Any) -> None:
        await self.ws.send(json.dumps(message))

    async def next(self, within_s: float = 10.0) -> Message:
        async with asyncio.timeout(within_s):
            raw = await self.ws.recv()
        assert isinstance(raw, str)
        message: Message = json.loads(raw)
        assert raw == json.dumps(message, separators=(",", ":"), ensure_ascii=False)
        assert set(message) == VLLM_OMNI_KEYS[message["type"]], message
        if message["type"] == "response.audio.delta":
            assert message["format"] == "wav" and base64.b64decode(message["data"])[:4] == b"RIFF"
        self.messages.append(message)
        return message

    async def answer(self, start: Message | None = None) -> list[Message]:
        """One whole answer (from its `start`, when read already), checked against
        vLLM-Omni's order."""
        got = [start or await self.next()]
        while got[-1]["type"] != "response.audio.done":
            got.append(await self.next())
        assert runs(got) == ANSWER
        deltas = "".join(m["delta"] for m in got if m["type"] == "response.text.delta")
        assert next(m for m in got if m["type"] == "response.text.done")["text"] == deltas
        return got

    async def closed_with(self) -> int | None:
        with suppress(ConnectionClosed):
            async with asyncio.timeout(10):
                while True:
                    await self.next()
        return self.ws.close_code


def runs(messages: list[Message]) -> list[str]:
    """The message types with each run of one type as one."""
    types = [m["type"] for m in messages]
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


OpenStrict = Callable[[Message], AbstractAsyncContextManager[StrictClient]]


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path, "audio_ms: 600, chunk_ms: 100, realtime_factor: 4.0")
    async with served_app(Settings(pipeline=graph), redis_url) as served:
        yield served


@pytest.fixture
def open_strict(server: ServedApp) -> OpenStrict:
    @asynccontextmanager
    async def open_(config: Message) -> AsyncIterator[StrictClient]:
        url = f"{server.ws_url}/v1/video/chat/stream"
        async with connect(url, max_size=None) as ws:
            client = StrictClient(ws)
            await client.send(type="session.config", **config)
            yield client

    return open_


def tone(seconds: float, hz: float = 330.0) -> npt.NDArray[np.int16]:
    t = np.arange(round(16_000 * seconds)) / 16_000
    return (6000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


async def test_a_vllm_omni_client_runs_a_whole_session(
    open_strict: OpenStrict, server: ServedApp
) -> None:
    engine = engine_of(server)
    config = {
        "model": "Qwen/Qwen3-Omni-30B-A3B-Instruct",
        "colour": "blue",  # unknown: ignored
        "speaker": "Ethan",
        "sampling_params_list": [{"max_tokens": 64, "temperature": 0.4}, {}, {}],
        "use_audio_in_video": False,
    }
    async with open_strict(config) as client:
        await client.send(type="ping")
        assert await client.next() == {"type": "pong"}  # the config got no answer of its own
        session = server.services.manager.sessions()[0]  # type: ignore[union-attr]
        assert session.config.voice == "Ethan"
        if "max_output_tokens" in SessionConfig.model_fields:
            assert getattr(session.config, "max_output_tokens") == 64  # noqa: B009

        early = tone(0.3)
        await client.send(
            type="video.query", text="What is there?", audio_data=b64(early.tobytes())
        )
        assert await client.next() == {"type": "error", "message": "No frames buffered"}

        await client.send(type="video.frame", data=b64(b"not an image at all"))
        assert await client.next() == {"type": "error", "message": "Invalid image data"}
        frames = [jpeg((200, 40, 40)), jpeg((40, 200, 40))]
        for image in frames:
            await client.send(type="video.frame", data=b64(image))

        await client.send(type="video.query", text="What changed?")
        await client.answer()
        request = engine.requests[-1]
        assert request.text == "What changed?"
        assert [f.image for f in request.frames] == frames
        # The audio of the refused query waited for this one, use_audio_in_video or not.
        assert len(early) - 320 < len(request.audio) <= len(early)

        speech = tone(0.6, 440.0)
        await client.send(type="audio.chunk", data=b64(speech[:4800].tobytes()))
        await client.send(type="video.query", text="", audio_data=b64(speech[4800:].tobytes()))
        await client.answer()
        request = engine.requests[-1]
        assert not request.text  # a voice-only turn
        assert len(speech) - 320 < len(request.audio) <= len(speech)
        assert np.array_equal(request.audio, speech[: len(request.audio)])

        engine.audio_ms = 5_000
        await client.send(type="video.query", text="Tell me a long story.")
        cut = [await client.next()]
        while cut[-1]["type"] != "response.audio.delta":
            cut.append(await client.next())
        assert runs(cut) == ANSWER[:4]  # its text is done before its first audio
        engine.audio_ms = 300
        await client.send(type="video.query", text="Just say hi.")
        between = []
        while (message := await client.next())["type"] != "response.start":
            between.append(message["type"])
        assert set(between) <= {"response.audio.delta"}  # no done messages for the cut one
        await client.answer(message)
        assert engine.requests[-1].text == "Just say hi."

        await client.send(type="video.done")
        assert await client.next() == {"type": "session.done"}
        assert await client.closed_with() == 1000


async def test_any_message_keeps_the_session_from_its_idle_timeout(
    open_strict: OpenStrict, server: ServedApp
) -> None:
    assert server.services.manager is not None
    server.services.manager.limits = SessionLimits(idle_timeout_s=0.6, watchdog_interval_s=0.05)
    async with open_strict({"modalities": ["text"]}) as client:
        for _ in range(6):  # 1.2 s of pings, each well within the timeout
            await asyncio.sleep(0.2)
            await client.send(type="ping")
            assert await client.next() == {"type": "pong"}
        assert await client.next(within_s=5) == {"type": "error", "message": "Idle timeout"}
        assert await client.closed_with() == 1000
        assert client.messages[-1] == {"type": "error", "message": "Idle timeout"}


async def test_a_failed_answer_reads_as_from_vllm_omni(
    open_strict: OpenStrict, server: ServedApp
) -> None:
    engine_of(server).fail_with = "the model fell over"
    async with open_strict({}) as client:
        await client.send(type="video.frame", data=b64(jpeg((9, 90, 9))))
        await client.send(type="video.query", text="Anything?")
        assert [await client.next() for _ in range(3)] == [
            {"type": "response.start"},
            {"type": "error", "message": "Query processing failed"},
            {"type": "response.text.done", "text": ""},
        ]
        await client.send(type="ping")
        assert await client.next() == {"type": "pong"}  # no audio done: there was no audio


async def test_before_the_config_errors_read_as_from_vllm_omni(server: ServedApp) -> None:
    async with connect(f"{server.ws_url}/v1/video/chat/stream") as ws:
        client = StrictClient(ws)
        await ws.send("{oops")
        assert await client.next() == {"type": "error", "message": "Invalid JSON in session.config"}
        await client.send(type="ping")
        assert await client.next() == {
            "type": "error",
            "message": "Expected session.config, got: ping",
        }
        assert await client.closed_with() == 1008


async def test_without_the_extras_a_dropped_connection_ends_its_session(
    open_strict: OpenStrict, server: ServedApp
) -> None:
    """No resume token was given, so nobody can resume: the session ends at once, not after
    the grace period (30 s)."""
    assert server.services.manager is not None
    async with open_strict({}) as client:
        await client.send(type="ping")
        assert await client.next() == {"type": "pong"}
        session = server.services.manager.sessions()[0]
        client.ws.transport.abort()
    async with asyncio.timeout(5):
        while not session.closed:
            await asyncio.sleep(0.02)
    assert session.close_reason == "client_gone"
