"""Redis goes away under live sessions, then comes back: a real redis-server of the test's
own, killed and restarted empty on the same socket (a real restart), or stopped with
SIGSTOP (a stalled server). The calls go on, each client hears of the outage once, the log
says it once, nothing emitted during the outage is missing from the resume log, and the
leases count the live sessions again."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis

from loadtest.speech import utterances_with_gaps
from pipeline.engine_pipeline import EnginePipeline
from sessions.errors import SessionLimitError
from sessions.events import ErrorEvent, Event, ResponseDone, SessionStateChanged
from sessions.manager import SessionManager
from sessions.redis_link import RedisLink
from sessions.session import Session, SessionLimits
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink
from tests.metrics import metric_value

from .conftest import feed

SESSIONS = 4


class OwnRedis:
    """A redis-server this test alone uses, so it can kill and restart it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = str(workdir / "redis.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed: apt-get install redis-server")
        self.proc = subprocess.Popen(
            [exe, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700"]
            + ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not os.path.exists(self.socket) or not self._answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail("the test's own redis-server did not start")
            time.sleep(0.02)

    def _answers(self) -> bool:
        import redis as redis_sync

        client = redis_sync.Redis(unix_socket_path=self.socket, socket_timeout=1)
        try:
            return bool(client.ping())
        except redis_sync.ConnectionError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped server dies only when resumed
                self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis(Path(tempfile.mkdtemp(prefix="parley-outage-")))
    server.start()
    try:
        yield server
    finally:
        server.kill()  # no process left behind, whatever happened
        shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture
async def client(own_redis: OwnRedis) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis(unix_socket_path=own_redis.socket, socket_timeout=1.0)
    try:
        yield redis
    finally:
        await redis.aclose()


def fast_link(redis: aioredis.Redis) -> RedisLink:
    """Short deadlines, so an outage is noticed and its end seen within a fraction of a
    second (the defaults are 2 s, 0.25 s and 1 s)."""
    return RedisLink(redis, call_timeout_s=0.5, probe_interval_s=0.05, heartbeat_interval_s=0.1)


def speech(*texts: str) -> np.ndarray:
    pcm, _ = utterances_with_gaps(list(texts), gap_ms=900, lead_ms=300)
    return pcm


async def wait_after(sink: ClockedSink, start: int, match: Callable[[Event], bool]) -> Event:
    """The first event from index `start` on that matches, waiting for it (generously)."""
    async with asyncio.timeout(20):
        while True:
            for event in sink.events[start:]:
                if match(event):
                    return event
            await asyncio.sleep(0.02)


def listening(event: Event) -> bool:
    return isinstance(event, SessionStateChanged) and event.state == "listening"


def outage_errors(sink: ClockedSink) -> list[ErrorEvent]:
    return [e for e in sink.events if isinstance(e, ErrorEvent) and e.code == "redis_unavailable"]


def parley_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("parley") and r.levelno >= level]


async def start_sessions(
    manager: SessionManager, config: dict[str, object] | None = None
) -> list[tuple[Session, ClockedSink]]:
    pairs = []
    for _ in range(SESSIONS):
        sink = await ClockedSink().__aenter__()
        session = await manager.create(sink, config)
        await sink.wait_for(lambda e: e.type == "session.created")
        pairs.append((session, sink))
    return pairs


async def stop_sinks(pairs: list[tuple[Session, ClockedSink]]) -> None:
    for _, sink in pairs:
        await sink.__aexit__(None, None, None)


async def check_replay_holds(session: Session, sink: ClockedSink, since: int) -> None:
    """Every logged kind of event the client got from index `since` on is in the resume
    log, in the order it was sent."""
    sent = [e.event_id for e in sink.events[since:] if not e.droppable]
    await session.event_log.flushed()
    logged = [body["event_id"] for body in await session.event_log.replay()]
    assert len(logged) == len(set(logged))
    assert [i for i in logged if i in set(sent)] == sent


@pytest.mark.slow
async def test_a_redis_restart_under_live_calls_loses_no_event_and_no_lease(
    own_redis: OwnRedis,
    client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="parley")
    engine = FakeEngine(audio_ms=300)
    limits = SessionLimits(watchdog_interval_s=0.05)
    manager = SessionManager(
        client, EnginePipeline(engine), max_sessions=8, limits=limits, link=fast_link(client)
    )
    # The lease TTL is 30 s, so the upkeep renews only every 10 s: leases that come back
    # within this test came back because Redis did.
    async with manager:
        pairs = await start_sessions(manager)
        try:
            # A first turn each with Redis up.
            await asyncio.gather(*(feed(s, speech("Hello, can you hear me?")) for s, _ in pairs))
            for _, sink in pairs:
                done = await sink.wait_for(lambda e: isinstance(e, ResponseDone))
                assert isinstance(done, ResponseDone) and done.status == "completed"
                await wait_after(sink, sink.events.index(done), listening)

            own_redis.kill()
            marks = [len(sink.events) for _, sink in pairs]

            # Talking on through the outage, at the pace of a microphone.
            question = speech("What is the weather like in Paris today?")
            await asyncio.gather(*(feed(s, question, realtime=True) for s, _ in pairs))
            for (session, sink), mark in zip(pairs, marks, strict=True):
                done = await wait_after(sink, mark, lambda e: isinstance(e, ResponseDone))
                # The turn's audio was kept locally, so it is answered.
                assert isinstance(done, ResponseDone) and done.status == "completed", done
                assert not session.closed
            with pytest.raises(SessionLimitError, match="unreachable"):
                await manager.create(ClockedSink())
            assert metric_value(manager.metrics.redis_up) == 0

            own_redis.start()  # empty, on the same socket: what a restart without data is
            async with asyncio.timeout(20):
                while metric_value(manager.metrics.redis_up) != 1:
                    await asyncio.sleep(0.05)
            assert await manager.leases.count() == SESSIONS
            for (session, sink), mark in zip(pairs, marks, strict=True):
                await check_replay_holds(session, sink, mark)
                assert await client.exists(session.keys.meta)
                assert await client.hlen(session.keys.items) == len(await session.history.items())

            # Every client was told once; the log said it once, and that it is over.
            for _, sink in pairs:
                (told,) = outage_errors(sink)
                assert told.error_type == "server_error"
                assert "unreachable" in told.message
            warnings = parley_records(caplog, logging.WARNING)
            assert [r.name for r in warnings] == ["parley.sessions.redis"], warnings
            back = [r.getMessage() for r in caplog.records if "Redis is back" in r.getMessage()]
            assert len(back) == 1 and f"{SESSIONS} live sessions restored" in back[0]
            assert "0 dropped" in back[0]
            assert metric_value(manager.metrics.redis_outages) == 1
            assert metric_value(manager.metrics.redis_spilled_writes) > 0

            # And the next turn works as before.
            marks = [len(sink.events) for _, sink in pairs]
            await asyncio.gather(*(feed(s, speech("Thank you.")) for s, _ in pairs))
            for sink, mark in zip((p[1] for p in pairs), marks, strict=True):
                done = await wait_after(sink, mark, lambda e: isinstance(e, ResponseDone))
                assert isinstance(done, ResponseDone) and done.status == "completed"
        finally:
            await manager.close()
            await stop_sinks(pairs)
    assert await client.keys("*") == []


async def test_a_stalled_redis_costs_one_warning_and_keeps_every_event(
    own_redis: OwnRedis,
    client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGSTOP: calls hang rather than fail. The call deadline turns that into an outage;
    when the server resumes, it still holds what came before, and the spilled writes join
    it in order (the audio stream is whole again). A session that ended meanwhile has its
    lease and keys removed then, not at their TTLs."""
    caplog.set_level(logging.INFO, logger="parley")
    manager = SessionManager(client, EnginePipeline(FakeEngine()), link=fast_link(client))
    async with manager:
        pairs = await start_sessions(manager, {"turn_detection": None})
        try:
            await asyncio.gather(*(feed(s, speech("Before.")) for s, _ in pairs))
            own_redis.pause()
            try:
                await asyncio.gather(*(feed(s, speech("During."), realtime=True) for s, _ in pairs))
                for session, _ in pairs:
                    await session.add_text("typed while Redis was stalled")
                assert metric_value(manager.metrics.redis_up) == 0
                ended = pairs[-1][0]
                await manager.close_session(ended.session_id)
            finally:
                own_redis.resume()
            async with asyncio.timeout(20):
                while metric_value(manager.metrics.redis_up) != 1:
                    await asyncio.sleep(0.05)
            for _, sink in pairs:
                (_told,) = outage_errors(sink)
            for session, sink in pairs[:-1]:
                await check_replay_holds(session, sink, 0)  # the whole log: nothing lost
                fed_ms = session.describe()["input_audio_ms"]
                assert await session.audio.length() == fed_ms // 20
                texts = [i.text for i in await session.history.items()]
                assert texts == ["typed while Redis was stalled"]
                assert await client.llen(session.keys.history) == 1
            assert await manager.leases.count() == SESSIONS - 1
            assert await client.exists(*ended.keys.all()) == 0
            warnings = parley_records(caplog, logging.WARNING)
            assert [r.name for r in warnings] == ["parley.sessions.redis"], warnings
        finally:
            await manager.close()
            await stop_sinks(pairs)
    assert await client.keys("*") == []
