"""Both WebSocket endpoints under hostile input and churn, with real clients over loopback.

The app runs under a real uvicorn on 127.0.0.1 (its default WebSocket protocol, the one
`parley serve` uses), with a fake engine that answers quickly, a small session cap and an
API key. Clients: the official `openai` SDK and the `websockets` library, as users run them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI
from PIL import Image
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from realtime.error_throttle import DEFAULT_LIMIT
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from web.settings import Settings

KEY = "sk-test-ws-faults"
CAP = 8
BURST = 1_000
Message = dict[str, Any]
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT_ITEM = {
    "type": "conversation.item.create",
    "item": {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Hello?"}],
    },
}


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path, "audio_ms: 300, chunk_ms: 100, realtime_factor: 20.0")
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=CAP)
    async with served_app(settings, redis_url) as app:
        yield app


@contextlib.asynccontextmanager
async def openai_peer(server: ServedApp, query: str = "") -> AsyncIterator[RecordingClient]:
    url = f"{server.ws_url}/v1/realtime?model=parley{'&' + query if query else ''}"
    async with connect(url, additional_headers=AUTH, proxy=None) as ws:
        yield RecordingClient(ws, wait_s=10.0)


def _jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (90, 120, 150)).save(out, format="JPEG")
    return out.getvalue()


VIDEO_CONFIG: Message = {"type": "session.config", "parley": {"extras": True}}
"""The video stream's ids, codes and resume are Parley's extras: these tests opt in."""
FRAME = base64.b64encode(_jpeg()).decode("ascii")


@contextlib.asynccontextmanager
async def video_peer(server: ServedApp) -> AsyncIterator[RecordingClient]:
    url = f"{server.ws_url}/v1/video/chat/stream"
    async with connect(url, additional_headers=AUTH, proxy=None, max_size=None) as ws:
        yield RecordingClient(ws, wait_s=10.0)


async def openai_turn(peer: RecordingClient) -> None:
    await peer.send(TEXT_ITEM)
    await peer.send({"type": "response.create"})
    done = await peer.wait_type("response.done")
    assert done["response"]["status"] == "completed", done


async def video_turn(peer: RecordingClient) -> None:
    await peer.send({"type": "video.frame", "data": FRAME})  # a query needs a frame
    await peer.send({"type": "video.query", "text": "What do you see?"})
    done = await peer.wait_type("response.text.done")
    assert done["status"] == "completed", done


async def session_keys(redis: aioredis.Redis) -> list[bytes]:
    return [key async for key in redis.scan_iter("*{sess_*")]


async def all_gone(server: ServedApp, redis: aioredis.Redis, within_s: float = 5.0) -> None:
    """No session left: none in the manager, no lease, no session key in Redis."""
    manager = server.manager
    async with asyncio.timeout(within_s):
        while len(manager) or await manager.leases.count() or await session_keys(redis):
            await asyncio.sleep(0.02)


# --- clean close vs abrupt drop ------------------------------------------------------------


async def test_the_openai_sdk_closing_mid_answer_ends_the_session_at_once(
    server: ServedApp, redis: aioredis.Redis
) -> None:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.realtime.connect(model="parley") as conn,
    ):
        created = await conn.recv()
        assert created.type == "session.created"
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            }
        )
        await conn.response.create()
        async with asyncio.timeout(10):
            while (await conn.recv()).type != "response.output_audio.delta":
                pass
        assert len(server.manager) == 1
    # The SDK's exit sends a close frame (1000) while the answer is still going out.
    await all_gone(server, redis)


@pytest.mark.parametrize("endpoint", ["openai", "video"])
async def test_a_clean_close_ends_the_session_at_once(
    server: ServedApp, redis: aioredis.Redis, endpoint: str
) -> None:
    if endpoint == "openai":
        async with openai_peer(server) as peer:
            await peer.wait_type("session.created")
            await openai_turn(peer)
            assert len(server.manager) == 1
    else:
        async with video_peer(server) as peer:
            await peer.send(VIDEO_CONFIG)
            await peer.wait_type("session.created")
            await video_turn(peer)
            assert len(server.manager) == 1
            await peer.ws.close(1001)  # "going away", as a browser leaving the page
    await all_gone(server, redis)


@pytest.mark.parametrize("endpoint", ["openai", "video"])
async def test_an_abrupt_drop_keeps_the_session_for_a_resume(
    server: ServedApp, redis: aioredis.Redis, endpoint: str
) -> None:
    manager = server.manager
    if endpoint == "openai":
        async with openai_peer(server) as first:
            created = await first.wait_type("session.created")
            session_id = created["session"]["id"]
            token = created["session"]["parley"]["resume_token"]
            first.ws.transport.abort()  # no close frame: the network dropped
    else:
        async with video_peer(server) as first:
            await first.send(VIDEO_CONFIG)
            created = await first.wait_type("session.created")
            session_id, token = created["session_id"], created["resume_token"]
            first.ws.transport.abort()
    session = manager.get(session_id)
    await asyncio.sleep(0.5)  # the server has noticed by now
    assert not session.closed and len(manager) == 1

    if endpoint == "openai":
        resume = f"session_id={session_id}&resume_token={token}"
        async with openai_peer(server, resume) as second:
            await openai_turn(second)
    else:
        async with video_peer(server) as second:
            await second.send(
                {"type": "session.resume", "session_id": session_id, "resume_token": token}
            )
            await video_turn(second)
    assert "error" not in [m["type"] for m in second.events]
    await all_gone(server, redis)  # and the resumed connection's clean close ends it


# --- churn ---------------------------------------------------------------------------------


@pytest.mark.slow
async def test_hundreds_of_connect_talk_close_cycles_never_hit_the_session_cap(
    server: ServedApp, redis: aioredis.Redis
) -> None:
    """200 cycles, 4 at a time, against a cap of 8: every closed session must free its slot
    at once, or the cap fills within a few dozen cycles (1013 session_limit)."""

    async def openai_cycle() -> None:
        async with openai_peer(server) as peer:
            first = await peer.next()
            assert first["type"] == "session.created", first
            await openai_turn(peer)

    async def video_cycle() -> None:
        async with video_peer(server) as peer:
            await peer.send({**VIDEO_CONFIG, "modalities": ["text"]})
            first = await peer.next()
            assert first["type"] == "session.created", first
            await video_turn(peer)

    cycles: list[Callable[[], Awaitable[None]]] = [openai_cycle, video_cycle] * 100
    async with asyncio.timeout(50):
        await _four_at_a_time(cycles[:40])
        # Connection pools have grown to their working size; nothing grows from here on.
        fds, threads = open_fds(), threading.active_count()
        await _four_at_a_time(cycles[40:])
    await all_gone(server, redis)
    # A leak would be one per cycle (160 here); a few sockets may still be closing.
    assert open_fds() <= fds + 10
    # the loop's default executor may add a worker or two under load (it grows on demand)
    assert threading.active_count() <= threads + 4


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _four_at_a_time(cycles: list[Callable[[], Awaitable[None]]]) -> None:
    async with asyncio.TaskGroup() as group:
        for worker in range(4):
            group.create_task(_run_cycles(cycles[worker::4]))


async def _run_cycles(cycles: list[Callable[[], Awaitable[None]]]) -> None:
    for cycle in cycles:
        await cycle()


# --- a burst of bad messages ---------------------------------------------------------------


def suppressed(message: str) -> int:
    """How many errors a summary says it stands for ("N more errors ...")."""
    return int(message.split(" ", 1)[0])


async def read_errors(
    peer: RecordingClient, error_text: Callable[[Message], tuple[str, str]]
) -> int:
    """Read until every one of the burst's errors is accounted for (sent, or counted in a
    summary); the number of `error` events that took."""
    accounted, events, summaries = 0, 0, 0
    async with asyncio.timeout(20):
        while accounted < BURST:
            message = await peer.next()
            if message["type"] != "error":
                continue
            events += 1
            code, text = error_text(message)
            if code == "errors_suppressed":
                summaries += 1
                accounted += suppressed(text)
            else:
                assert code in ("invalid_json", "invalid_message"), message
                accounted += 1
    assert accounted == BURST and summaries >= 1
    return events


def openai_error(message: Message) -> tuple[str, str]:
    return message["error"]["code"], message["error"]["message"]


def video_error(message: Message) -> tuple[str, str]:
    return message["code"], message["message"]


@pytest.mark.parametrize("endpoint", ["openai", "video"])
async def test_a_burst_of_malformed_messages_is_summarised_not_a_disconnect(
    server: ServedApp, endpoint: str
) -> None:
    peer_of = openai_peer if endpoint == "openai" else video_peer
    async with peer_of(server) as peer:
        if endpoint == "video":
            await peer.send({**VIDEO_CONFIG, "modalities": ["text"]})
        await peer.wait_type("session.created")
        reader = read_errors(peer, openai_error if endpoint == "openai" else video_error)
        async with asyncio.TaskGroup() as group:
            counting = group.create_task(reader)  # the client reads all along
            for n in range(BURST):
                await peer.ws.send("{not json " + str(n))
        events = counting.result()
        # Bounded: the budget per second (plus its summary), for however long it took.
        assert events < BURST // 4, events
        assert events >= DEFAULT_LIMIT
        await (openai_turn(peer) if endpoint == "openai" else video_turn(peer))
        assert peer.ws.close_code is None  # still open


@pytest.mark.parametrize("endpoint", ["openai", "video"])
async def test_a_burst_of_messages_that_each_get_a_reply_gets_every_reply(
    server: ServedApp, endpoint: str
) -> None:
    """1,000 pings (or session.updates) back to back: more replies than the outbound queue
    holds, so the server must stop reading until they have gone out, not close."""
    peer_of = openai_peer if endpoint == "openai" else video_peer
    async with peer_of(server) as peer:
        if endpoint == "video":
            await peer.send({**VIDEO_CONFIG, "modalities": ["text"]})
            message: Message = {"type": "ping"}
            reply = "pong"
        else:
            message = {"type": "session.update", "session": {"instructions": "Be brief."}}
            reply = "session.updated"
        await peer.wait_type("session.created")

        async def count_replies() -> None:
            async with asyncio.timeout(20):
                while sum(m["type"] == reply for m in peer.events) < BURST:
                    await peer.next()

        async with asyncio.TaskGroup() as group:
            group.create_task(count_replies())  # the client reads all along
            for _ in range(BURST):
                await peer.send(message)
        assert "error" not in [m["type"] for m in peer.events]
        await (openai_turn(peer) if endpoint == "openai" else video_turn(peer))


# --- oversized input -----------------------------------------------------------------------


async def test_an_append_over_the_cap_is_a_clear_error_and_the_connection_lives(
    server: ServedApp,
) -> None:
    async with openai_peer(server) as peer:
        await peer.wait_type("session.created")
        big = base64.b64encode(b"\0" * ((1 << 20) + 2)).decode("ascii")
        await peer.send({"type": "input_audio_buffer.append", "event_id": "big", "audio": big})
        error = await peer.wait_type("error")
        assert error["error"]["code"] == "audio_too_large"
        assert error["error"]["event_id"] == "big" and error["error"]["param"] == "audio"
        assert "limit is 1,048,576 bytes (1 MiB" in error["error"]["message"]
        fits = base64.b64encode(b"\0" * (1 << 20)).decode("ascii")
        await peer.send({"type": "input_audio_buffer.append", "audio": fits})
        await openai_turn(peer)
        assert "error" not in [m["type"] for m in peer.events[peer.events.index(error) + 1 :]]


async def test_a_message_over_16_mib_closes_both_endpoints_with_1009(server: ServedApp) -> None:
    for peer_of in (openai_peer, video_peer):
        async with peer_of(server) as peer:
            await peer.ws.send("x" * (16 * 1024 * 1024 + 1))
            with pytest.raises(ConnectionClosed):
                await peer.read_to_the_end(within_s=10.0)
            assert peer.ws.close_code == 1009
