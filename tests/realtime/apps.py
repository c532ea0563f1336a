"""The app in process for transport tests: started, with its pipeline ready, and an ASGI
client for signaling (media and data channels still go over real loopback sockets)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette

from web.app import Services, create_app
from web.settings import Settings


@contextlib.asynccontextmanager
async def running_app(settings: Settings, redis_url: str) -> AsyncIterator[Starlette]:
    application = create_app(settings, redis_url)
    async with application.router.lifespan_context(application):
        services: Services = application.state.services
        async with asyncio.timeout(10):
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
