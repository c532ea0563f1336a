"""An app's webhook endpoint for the OpenAI SIP flow tests: a real HTTP server (uvicorn on a
loopback port) that records each delivery and answers with the statuses it is told to, and
can run the app's handler (verify, then accept/reject/refer) before answering, as apps do.
`serving` runs any ASGI app so (Parley's routes, for the openai SDK to call over HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pipeline.tasks import cancel_and_wait


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the test owns the process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(frozen=True)
class Delivery:
    body: bytes
    headers: dict[str, str]


Handler = Callable[[Delivery], Awaitable[None]]


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)
    """Answers for the next deliveries, in order; 200 once they run out."""
    handler: Handler | None = None
    deliveries: list[Delivery] = field(default_factory=list)
    delivered: asyncio.Event = field(default_factory=asyncio.Event)

    async def endpoint(self, request: Request) -> Response:
        delivery = Delivery(await request.body(), dict(request.headers))
        self.deliveries.append(delivery)
        self.delivered.set()
        if self.handler is not None:
            await self.handler(delivery)
        return Response(status_code=self.statuses.pop(0) if self.statuses else 200)


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    """`app` under uvicorn on a free loopback port, without its lifespan: its base URL."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning")
        server = _QuietServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]), name=f"uvicorn:{port}")
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    await asyncio.sleep(0.01)
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            await asyncio.wait({task}, timeout=5)
            await cancel_and_wait(task)


@contextlib.asynccontextmanager
async def webhook_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver("")
    app = Starlette(routes=[Route("/webhook", receiver.endpoint, methods=["POST"])])
    async with serving(app) as base:
        receiver.url = f"{base}/webhook"
        yield receiver


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connections are refused at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/webhook"
