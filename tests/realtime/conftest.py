"""Realtime fixtures: the session fixtures (a manager on the test Redis, a fake engine,
a clocked sink), shared so protocol tests drive a real Session; and `http`, an ASGI client
for the `app` fixture that each signaling and WebRTC test module defines for itself."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from tests.sessions.conftest import MakeSession, engine, limits, make_session, manager

from .apps import asgi_client

__all__ = ["MakeSession", "engine", "http", "limits", "make_session", "manager"]


@pytest.fixture
async def http(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app) as client:
        yield client
