"""The server's WebSocket protocol reads ahead of the app, boundedly: no flow-control calls
while the app keeps up, a paused socket while it does not, and every message in order."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from pipeline.tasks import cancel_and_wait
from tests.realtime.stalled_client import StalledClient
from web.ws_protocol import ABANDON_S, MAX_QUEUED, SEND_BUFFER_BYTES, ReadAheadWebSocketProtocol

COUNT = 2_000


class Recorder(ReadAheadWebSocketProtocol):
    pauses = 0
    most_queued = 0

    def send_receive_event_to_app(self) -> None:
        super().send_receive_event_to_app()
        Recorder.most_queued = max(Recorder.most_queued, self.queue.qsize())
        if self.read_paused:
            Recorder.pauses += 1


class App:
    def __init__(self) -> None:
        self.received: list[str] = []
        self.reading = asyncio.Event()
        self.done = asyncio.Event()
        self.sent = 0
        self.close_s: float | None = None
        """How long the close took, in `talk`."""

    async def talk(self, websocket: WebSocket) -> None:
        """Write until a write blocks (the client does not read), then close 1008."""
        await websocket.accept()
        while True:
            try:
                async with asyncio.timeout(0.3):
                    await websocket.send_text(json.dumps({"n": self.sent, "pad": "x" * 4000}))
            except TimeoutError:
                break
            self.sent += 1
        started = time.monotonic()
        await websocket.close(1008, "client_too_slow")
        self.close_s = time.monotonic() - started
        self.done.set()

    async def route(self, websocket: WebSocket) -> None:
        await websocket.accept()
        await self.reading.wait()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            self.received.append(message["text"])
        self.done.set()


@pytest.fixture
async def served() -> AsyncIterator[tuple[App, str]]:
    app = App()
    Recorder.pauses = Recorder.most_queued = 0
    Recorder.abandon_s = ABANDON_S
    routes = [WebSocketRoute("/ws", app.route), WebSocketRoute("/talk", app.talk)]
    starlette = Starlette(routes=routes)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(starlette, ws=Recorder, log_config=None, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield app, f"ws://127.0.0.1:{port}/ws"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        await cancel_and_wait(task)
        sock.close()


async def test_an_app_that_keeps_up_never_pauses_the_socket(served: tuple[App, str]) -> None:
    app, url = served
    app.reading.set()
    async with connect(url, compression=None) as ws:
        for i in range(100):
            await ws.send(f"m{i}")
            await asyncio.sleep(0.002)
    await asyncio.wait_for(app.done.wait(), 5)
    assert app.received == [f"m{i}" for i in range(100)]
    assert Recorder.pauses == 0


async def test_a_stalled_app_pauses_the_socket_and_loses_nothing(served: tuple[App, str]) -> None:
    app, url = served
    async with connect(url, compression=None) as ws:
        for i in range(COUNT):
            await ws.send(f"m{i}" + "x" * 1000)
        await asyncio.sleep(0.3)  # the app reads nothing meanwhile
        assert Recorder.pauses > 0
        # read ahead by the bound, give or take what one socket read held (256 KiB)
        assert Recorder.most_queued <= MAX_QUEUED + 256
        assert Recorder.most_queued < COUNT
        app.reading.set()
    await asyncio.wait_for(app.done.wait(), 5)
    assert [text[: text.index("x")] for text in app.received] == [f"m{i}" for i in range(COUNT)]


async def stalled(url: str) -> StalledClient:
    port = int(url.split(":")[2].split("/")[0])
    client = await StalledClient.open("127.0.0.1", port, "/talk", {})
    client.stop_reading()
    return client


async def test_a_client_that_stops_reading_gets_its_close_frame_after_what_it_missed(
    served: tuple[App, str],
) -> None:
    app, url = served
    client = await stalled(url)
    try:
        await asyncio.wait_for(app.done.wait(), 10)
        assert app.close_s is not None and app.close_s < 0.1  # it did not wait for room
        # What waited for the client: the socket's fixed buffer, uvicorn's, one message.
        assert app.sent * 4000 < 2 * SEND_BUFFER_BYTES + 64 * 1024 + 64 * 1024
        received = await client.read_on()
    finally:
        client.abort()
    assert [m["n"] for m in received.messages] == list(range(app.sent))
    assert (received.close_code, received.close_reason) == (1008, "client_too_slow")


async def test_a_client_that_never_reads_again_is_dropped_after_the_close(
    served: tuple[App, str],
) -> None:
    app, url = served
    Recorder.abandon_s = 0.3
    client = await stalled(url)
    try:
        await asyncio.wait_for(app.done.wait(), 10)
        await asyncio.sleep(1.0)  # past `abandon_s`: the server has aborted the socket
        received = await client.read_on()  # so reading now finds a reset, not the rest
    finally:
        client.abort()
    assert received.close_code is None
