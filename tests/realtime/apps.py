"""The app in process for transport tests: started, with its pipeline ready, and an ASGI
client for signaling (media and data channels still go over real loopback sockets); or the
same app under a real uvicorn on a loopback port, for WebSocket clients."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from pipeline.tasks import cancel_and_wait
from realtime.transports.websocket.connection import MAX_MESSAGE_BYTES as WS_MAX_SIZE
from sessions import SessionManager
from tests.conftest import fail_on_keys_left
from web.app import Services, create_app
from web.settings import Settings
from web.ws_protocol import ReadAheadWebSocketProtocol

COLD_START_S = 180.0
"""How long a test waits for a pipeline to load. The cascade's first load on a fresh machine
converts its language model (`smollm.py`), which took over 30 s on a busy CI machine."""


@contextlib.asynccontextmanager
async def running_app(settings: Settings, redis_url: str) -> AsyncIterator[Starlette]:
    application = create_app(settings, redis_url)
    async with application.router.lifespan_context(application):
        services: Services = application.state.services
        async with asyncio.timeout(COLD_START_S):
            while not services.pipeline_ready:
                await asyncio.sleep(0.01)
        yield application


@contextlib.asynccontextmanager
async def asgi_client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://parley.test") as client:
        yield client


def fake_graph(engine_args: str = "") -> str:
    """A one-stage graph file body running the fake engine."""
    args = f", engine_args: {{{engine_args}}}" if engine_args else ""
    return (
        "name: fake\nstages:\n"
        f"  - {{name: model, engine: 'tests.fakes.fake_engine:FakeEngine'{args}}}\n"
        "outputs: [model]\n"
    )


def fake_graph_file(directory: Path, engine_args: str = "") -> str:
    """`fake_graph(engine_args)` written to a file in `directory`: its path."""
    path = directory / "fake.yaml"
    path.write_text(fake_graph(engine_args))
    return str(path)


@contextlib.asynccontextmanager
async def fake_app(
    directory: Path, redis_url: str, engine_args: str = "", **settings: Any
) -> AsyncIterator[Starlette]:
    """`running_app` on the fake-engine graph (its file in `directory`); `settings` are the
    rest of its Settings (max_sessions, api_key, ...)."""
    graph = fake_graph_file(directory, engine_args)
    async with running_app(Settings(pipeline=graph, **settings), redis_url) as app:
        yield app


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the test owns the process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class ServedApp:
    """An app under a real uvicorn on a loopback port, its pipeline ready."""

    app: Starlette
    port: int

    @property
    def services(self) -> Services:
        services: Services = self.app.state.services
        return services

    @property
    def manager(self) -> SessionManager:
        """The running server's session manager."""
        manager = self.services.manager
        assert manager is not None
        return manager

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def served_app(
    settings: Settings,
    redis_url: str,
    *,
    settings_port: bool = False,
    **uvicorn_options: Any,
) -> AsyncIterator[ServedApp]:
    """`create_app` under uvicorn on 127.0.0.1 (a free port), with the server's own
    WebSocket size limit; stopped (sessions closed, pipeline closed) on exit.

    `settings_port`: the settings name the port it listens on, as `parley serve --port`
    would (a settings port of 0 stays 0: the app then learns its port from the server).
    `uvicorn_options` go to `uvicorn.Config` over the defaults here."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        if settings_port and settings.port != 0:
            settings = replace(settings, port=port)
        app = create_app(settings, redis_url)
        options: dict[str, Any] = {
            "lifespan": "on",
            "log_config": None,
            "log_level": "warning",
            "ws_max_size": WS_MAX_SIZE,
            "ws": ReadAheadWebSocketProtocol,  # the server's (web/cli.py)
            **uvicorn_options,
        }
        server = _QuietServer(uvicorn.Config(app, **options))
        # Not a TaskGroup: the server runs across the `yield`, which a TaskGroup in an
        # async generator cannot span; the `finally` below owns it.
        task = asyncio.create_task(server.serve(sockets=[sock]), name="uvicorn")
        try:
            async with asyncio.timeout(COLD_START_S):
                while not (server.started and app.state.services.pipeline_ready):
                    if task.done():
                        raise RuntimeError("uvicorn stopped while starting")
                    if app.state.services.pipeline_error:
                        raise RuntimeError(app.state.services.pipeline_error)
                    await asyncio.sleep(0.02)
            yield ServedApp(app, port)
        finally:
            server.should_exit = True
            await asyncio.wait({task}, timeout=15)  # a graceful stop first
            await cancel_and_wait(task)


@contextlib.asynccontextmanager
async def two_workers(
    tmp: Path, redis_url: str, key: str, engine_args: str = "audio_ms: 1500, realtime_factor: 4.0"
) -> AsyncIterator[tuple[ServedApp, ServedApp]]:
    """Two apps on one Redis, as `--workers 2` makes two server processes: the fake graph,
    API key `key`, two sessions at most between them."""
    graph = fake_graph_file(tmp, engine_args)
    settings = Settings(pipeline=graph, api_key=key, max_sessions=2)
    async with served_app(settings, redis_url) as a, served_app(settings, redis_url) as b:
        yield a, b


@contextlib.asynccontextmanager
async def served_cascade(
    redis_socket: str, db: int, key: str, who: str
) -> AsyncIterator[ServedApp]:
    """The embedded cascade under a real uvicorn, on database `db` of the tests' own
    redis-server (a module's own, so that its keys are checked alone), with API key `key`;
    fails naming `who` if the server leaves keys behind."""
    url = f"unix://{redis_socket}?db={db}"
    async with served_app(Settings(pipeline="cascade", api_key=key, max_sessions=2), url) as app:
        yield app
    fail_on_keys_left(redis_socket, db, who)
