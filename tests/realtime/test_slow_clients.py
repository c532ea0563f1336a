"""A client that stops reading, against the real server (uvicorn on loopback, real sockets):
it is closed with 1008 `client_too_slow` once its output has been blocked for the bound,
its session ends with that reason, it is logged once and counted, its outbound queue stays
bounded meanwhile, and a second session on the same server is answered as usual."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from PIL import Image
from websockets.asyncio.client import connect

from pipeline.tasks import cancel_and_wait
from realtime.slow_clients import TOO_SLOW
from realtime.transports.websocket.connection import MessageConnection
from realtime.transports.websocket.sender import DEFAULT_MAX_ITEMS, DEFAULT_MAX_QUEUED_MS
from sessions import Session
from sessions.manager import SessionManager
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from tests.realtime.stalled_client import StalledClient
from web.settings import Settings

KEY = "sk-test-slow-clients"
AUTH = {"Authorization": f"Bearer {KEY}"}
STALL_S = 0.5
ANSWER_MS = 20_000
"""Long enough that a client that does not read fills every buffer before it ends."""
FILL_S = 6.0
"""At most how long paced audio takes to fill the socket's buffers (~3 s here)."""
TEXT_ITEM = {
    "type": "conversation.item.create",
    "item": {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Talk to me."}],
    },
}
VIDEO_CONFIG = {"type": "session.config", "parley": {"extras": True}}


def _jpeg() -> str:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (90, 120, 150)).save(out, format="JPEG")
    return base64.b64encode(out.getvalue()).decode("ascii")


FRAME = _jpeg()


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(
        tmp_path, f"audio_ms: {ANSWER_MS}, chunk_ms: 100, realtime_factor: 20.0"
    )
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=4, slow_client_s=STALL_S)
    async with served_app(settings, redis_url) as app:
        yield app


async def only_session(manager: SessionManager) -> Session:
    async with asyncio.timeout(5):
        while not manager.sessions():
            await asyncio.sleep(0.01)
    (session,) = manager.sessions()
    return session


async def all_gone(server: ServedApp, redis: aioredis.Redis, within_s: float = 5.0) -> None:
    """No session left: none in the manager, no lease, no session key in Redis."""
    manager = server.manager
    async with asyncio.timeout(within_s):
        while len(manager) or await manager.leases.count() or await session_keys(redis):
            await asyncio.sleep(0.02)


async def session_keys(redis: aioredis.Redis) -> list[bytes]:
    return [key async for key in redis.scan_iter("*{sess_*")]


def closed_count(server: ServedApp, transport: str) -> float:
    value = server.services.metrics.registry.get_sample_value(
        "parley_slow_clients_closed_total", {"transport": transport}
    )
    return value or 0.0


async def stalled(server: ServedApp, path: str, first: list[dict[str, Any]]) -> StalledClient:
    """A client on `path` that sends `first`, then never reads."""
    client = await StalledClient.open("127.0.0.1", server.port, path, AUTH)
    for message in first:
        client.send(message)
    client.stop_reading()
    return client


async def watch_until_closed(session: Session, sink: Any, within_s: float) -> tuple[float, int]:
    """Wait for `session` to close; (when, the most items its connection queued)."""
    most = 0
    async with asyncio.timeout(within_s):
        while not session.closed:
            if isinstance(sink, MessageConnection):
                most = max(most, sink.queued_items)
                assert sink.queued_ms <= DEFAULT_MAX_QUEUED_MS
            await asyncio.sleep(0.01)
    return time.monotonic(), most


@contextlib.asynccontextmanager
async def reading_peer(server: ServedApp, path: str) -> AsyncIterator[RecordingClient]:
    url = f"{server.ws_url}{path}"
    async with connect(url, additional_headers=AUTH, proxy=None, max_size=None) as ws:
        yield RecordingClient(ws, wait_s=10.0)


async def openai_answer_streams(peer: RecordingClient) -> None:
    """The reading client's answer: paced audio, as for any client, then its cancel."""
    await peer.wait_type("session.created")
    await peer.send(TEXT_ITEM)
    await peer.send({"type": "response.create"})
    first = await peer.wait_type("response.output_audio.delta")
    started = time.monotonic()
    while peer.audio_ms(first["response_id"]) < 1_000:
        await peer.wait_type("response.output_audio.delta", within_s=2)
    assert time.monotonic() - started < 2.0  # real time plus the lead, not stuck
    await peer.send({"type": "response.cancel"})
    done = await peer.wait_type("response.done")
    assert done["response"]["status"] == "cancelled"


@pytest.mark.parametrize("endpoint", ["openai", "video"])
async def test_a_client_that_never_reads_is_closed_and_others_go_on(
    server: ServedApp,
    redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
    endpoint: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="parley.realtime.slow_clients")
    manager = server.manager
    if endpoint == "openai":
        path, transport = "/v1/realtime?model=parley", "openai_ws"
        first: list[dict[str, Any]] = [TEXT_ITEM, {"type": "response.create"}]
    else:
        path, transport = "/v1/video/chat/stream", "video_stream"
        frame = {"type": "video.frame", "data": FRAME}  # a query needs a frame
        first = [VIDEO_CONFIG, frame, {"type": "video.query", "text": "Talk to me."}]
    client = await stalled(server, path, first)
    try:
        session = await only_session(manager)
        registry = server.services.websockets if endpoint == "openai" else None
        sink = (registry or server.services.video_streams).get(session.session_id)
        assert sink is not None
        started = time.monotonic()
        # Not a TaskGroup: the watch runs beside the second client, and is awaited below.
        watch = asyncio.create_task(watch_until_closed(session, sink, FILL_S + STALL_S + 5))
        try:
            async with reading_peer(server, "/v1/realtime?model=parley") as peer:
                await openai_answer_streams(peer)  # while the first one's output stalls
            ended, most = await watch
        finally:
            await cancel_and_wait(watch)
        assert session.close_reason == TOO_SLOW
        assert ended - started < FILL_S + STALL_S
        assert most <= DEFAULT_MAX_ITEMS
        received = await client.read_on()  # what it finds once it reads again
    finally:
        client.abort()
    assert received.close_code == 1008
    if endpoint == "openai":
        assert received.close_reason == TOO_SLOW  # (the video stream's clients get bare codes)
        assert received.messages[0]["type"] == "session.created"
    assert closed_count(server, transport) == 1
    logged = [r for r in caplog.records if r.name == "parley.realtime.slow_clients"]
    assert len(logged) == 1 and session.session_id in logged[0].getMessage()
    await all_gone(server, redis)
