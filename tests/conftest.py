"""Shared fixtures: a real redis-server on a private socket, and leak checks.

Every test is checked for leaks: asyncio tasks still running when it ends fail it, and
so do Redis keys left behind in the test's database.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
import redis.asyncio as aioredis


@pytest.fixture(scope="session")
def redis_socket() -> Iterator[str]:
    """A private redis-server for the whole run, on a unix socket in a temp dir."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed: apt-get install redis-server")
    workdir = Path(tempfile.mkdtemp(prefix="parley-test-redis-"))
    sock = workdir / "redis.sock"
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--databases",
            "64",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis_sync.Redis(unix_socket_path=str(sock))
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis_sync.ConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail("test redis-server did not start")
                time.sleep(0.02)
        client.close()
        yield str(sock)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def redis_url(redis_socket: str) -> Iterator[str]:
    """A URL to the test server; fails the test if it leaves keys behind."""
    url = f"unix://{redis_socket}?db=0"
    yield url
    fail_on_keys_left(redis_socket, 0, "test")


def fail_on_keys_left(redis_socket: str, db: int, who: str) -> None:
    """Fail if database `db` of the test server holds keys (emptied either way)."""
    client = redis_sync.Redis(unix_socket_path=redis_socket, db=db)
    try:
        left = sorted(k.decode() for k in client.keys("*"))
        client.flushdb()
    finally:
        client.close()
    if left:
        pytest.fail(f"{who} left Redis keys behind: {left[:10]}")


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


_peer_connections: weakref.WeakSet[Any] = weakref.WeakSet()


def _track_peer_connections() -> None:
    """Remember every RTCPeerConnection made in tests, so a test that leaves one open fails."""
    from aiortc import RTCPeerConnection

    original = RTCPeerConnection.__init__
    if getattr(original, "_parley_tracked", False):
        return

    def tracked(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _peer_connections.add(self)

    tracked._parley_tracked = True  # type: ignore[attr-defined]
    RTCPeerConnection.__init__ = tracked  # type: ignore[method-assign]


_track_peer_connections()


@pytest.fixture(autouse=True)
def _no_open_peer_connections() -> Iterator[None]:
    yield
    left = [pc for pc in _peer_connections if pc.connectionState != "closed"]
    if left:
        pytest.fail(f"test left {len(left)} RTCPeerConnection(s) open")


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running in its loop."""
    before = asyncio.all_tasks()
    yield
    await fail_on_tasks_left(before)


async def fail_on_tasks_left(before: set[asyncio.Task[Any]]) -> None:
    """Fail the test if tasks not in `before` still run in this loop (a directory whose tests
    share a module's loop runs this in that loop: tests/frameworks/conftest.py)."""
    current = asyncio.current_task()
    for _ in range(20):  # let tasks that are already finishing finish
        leaked = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
        if not leaked:
            return
        await asyncio.sleep(0.01)
    for task in leaked:
        task.cancel()
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leaked))
    pytest.fail(f"test left {len(leaked)} asyncio task(s) running: {names}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start `vllm serve` now, in a thread, if a selected test uses it: it comes up while
    the tests before those run (tests/pipeline/openai_chat/early_vllm.py)."""
    from tests.pipeline.openai_chat.early_vllm import EARLY, FIXTURE

    if any(FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        EARLY.begin()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the early `vllm serve`, if one was started.

    Servers the tests killed on purpose (SIGKILL, a sticky device error's `os._exit`)
    could not remove their runtime directories: the run removes them, leaving the temp
    directory as it found it."""
    from tests.pipeline.openai_chat.early_vllm import EARLY
    from web.leftover_dirs import REDIS_PREFIX, STAGES_PREFIX, sweep_stale_dirs

    EARLY.end()
    for prefix in (REDIS_PREFIX, STAGES_PREFIX):
        sweep_stale_dirs(prefix)
