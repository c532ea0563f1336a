"""The load generator's bare WebSocket client against a real uvicorn server: the upgrade,
all three frame-length encodings, pings answered (the server keeps the connection)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from loadtest.ws_raw_client import TEXT, masked_frame, open_raw
from pipeline.tasks import cancel_and_wait
from web.ws_protocol import ReadAheadWebSocketProtocol

SIZES = (10, 1_000, 70_000)


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    text = await websocket.receive_text()
    for size in SIZES:
        await websocket.send_text(text + "x" * size)
    await asyncio.sleep(1.0)  # several pings go by, each must be answered
    await websocket.send_text("still here")
    await websocket.receive_text()


async def test_the_raw_client_reads_every_length_and_answers_pings() -> None:
    app = Starlette(routes=[WebSocketRoute("/ws", echo)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        ws=ReadAheadWebSocketProtocol,
        ws_ping_interval=0.1,
        ws_ping_timeout=0.3,
        log_config=None,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    received: list[bytes] = []
    try:
        client = await open_raw(f"ws://127.0.0.1:{sock.getsockname()[1]}/ws?a=1", received.append)
        client.write(masked_frame(TEXT, b"hello"))
        async with asyncio.timeout(5):
            while len(received) < len(SIZES) + 1:
                await asyncio.sleep(0.01)
        assert received[:3] == [b"hello" + b"x" * size for size in SIZES]
        assert received[3] == b"still here"  # not closed for want of pongs
        client.write(masked_frame(TEXT, b"bye"))  # the route returns: uvicorn closes
        # the server's close frame ends the connection here
        async with asyncio.timeout(5):
            with contextlib.suppress(ConnectionError):
                await client.closed
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        await cancel_and_wait(task)
        sock.close()
