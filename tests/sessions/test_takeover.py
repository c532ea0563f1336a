"""Any process can take over any session: the fence, the heartbeat and mailbox, the end of
an unfinished answer, and two SessionManagers (two processes) on one Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from sessions import process_beat
from sessions.events import (
    ConversationItem,
    ConversationItemCreated,
    OutputAudioTranscriptDelta,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
)
from sessions.keys import SessionKeys
from sessions.manager import SessionManager
from sessions.ownership import Ownership, Takeover
from sessions.process_beat import ProcessBeat, process_key
from sessions.records import event_to_dict
from sessions.rehydrate import SessionRecord, unfinished_answer
from sessions.session import Session, SessionLimits
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink


async def created(manager: SessionManager, sink: ClockedSink) -> Session:
    """A session on `manager`, once the client has heard `session.created`."""
    session = await manager.create(sink)
    await sink.wait_for(lambda e: e.type == "session.created")
    return session


async def test_the_fence_grows_and_an_old_owner_cannot_release_or_delete(
    redis: aioredis.Redis,
) -> None:
    one, two = Ownership(redis, "proc_one"), Ownership(redis, "proc_two")
    keys = SessionKeys("sess_fenced")
    assert await one.claim("sess_fenced", 60) == 1
    assert await two.take_over("sess_fenced") == type(await two.take_over("sess_none"))(0, "")
    await redis.hset(keys.meta, "resume_token", "t")
    taken = await two.take_over("sess_fenced")
    assert (taken.fence, taken.previous_owner) == (2, "proc_one")
    assert not await one.owns("sess_fenced", 1) and await two.owns("sess_fenced", 2)
    assert not await one.release("sess_fenced", 1)
    assert await redis.hget(keys.meta, "owner") == b"proc_two"
    assert await two.release("sess_fenced", 2)
    assert await redis.hget(keys.meta, "owner") is None
    again = await one.take_over("sess_fenced")  # nobody owns it: taken at once
    assert (again.fence, again.previous_owner) == (4, "")
    await redis.delete(keys.meta)


async def test_a_clean_stop_against_a_silent_store_ends_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that takes the connection and never answers must not hold a shutdown: the
    heartbeat key is left to its TTL."""
    monkeypatch.setattr(process_beat, "STOP_DELETE_S", 0.3)
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read()  # reads every command, answers none

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = aioredis.Redis(host="127.0.0.1", port=port)

    async def handle(request: dict[str, Any]) -> None:
        pass

    beat = ProcessBeat(client, "proc_beat_silent", handle)
    beat.start()
    await asyncio.sleep(0.1)  # its first beat waits on the silent store
    began = time.monotonic()
    async with asyncio.timeout(5):
        await beat.stop()
    assert time.monotonic() - began < 2
    await client.aclose()
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_a_process_beats_and_answers_requests(redis: aioredis.Redis) -> None:
    asked: list[dict[str, Any]] = []

    async def handle(request: dict[str, Any]) -> None:
        asked.append(request)

    one = ProcessBeat(redis, "proc_beat_one", handle)
    two = ProcessBeat(redis, "proc_beat_two", handle)
    one.start()
    two.start()
    try:
        await one.listening()
        await two.listening()
        async with asyncio.timeout(2):
            while not await two.alive("proc_beat_one"):
                await asyncio.sleep(0.01)
        assert 0 < await redis.pttl(process_key("proc_beat_one")) <= 3000
        start = time.perf_counter()
        assert await two.ask("proc_beat_one", {"op": "let_go", "session_id": "s"}, 1.0)
        print(f"\nrequest answered in {(time.perf_counter() - start) * 1000:.1f} ms")
        assert asked[0]["op"] == "let_go" and asked[0]["session_id"] == "s"
        assert not await two.ask("proc_nobody", {"op": "let_go"}, 1.0)  # nobody listens
    finally:
        await one.stop()
        await two.stop()
    assert not await redis.exists(process_key("proc_beat_one"), process_key("proc_beat_two"))


def test_an_unfinished_answer_ends_cancelled_with_its_text_so_far() -> None:
    item = ConversationItem(id="item_a", role="assistant", status="in_progress", has_audio=True)
    log = [
        ResponseCreated(response_id="resp_1"),
        ResponseDone(response_id="resp_1", status="completed"),
        ResponseCreated(response_id="resp_2", metadata={"k": "v"}),
        ConversationItemCreated(item=item, previous_item_id=None, response_id="resp_2"),
        OutputAudioTranscriptDelta(response_id="resp_2", item_id="item_a", delta="Hello "),
        OutputAudioTranscriptDelta(response_id="resp_2", item_id="item_a", delta="there"),
    ]
    bodies = [event_to_dict(e) for e in log]
    done = unfinished_answer(bodies)
    assert done is not None
    assert (done.response_id, done.status, done.metadata) == ("resp_2", "cancelled", {"k": "v"})
    assert done.item is not None
    assert (done.item.id, done.item.text, done.item.status) == (
        "item_a",
        "Hello there",
        "incomplete",
    )
    finished = ResponseDone(response_id="resp_2", status="cancelled")
    assert unfinished_answer([*bodies, event_to_dict(finished)]) is None


@pytest.fixture
async def two_managers(
    redis: aioredis.Redis,
) -> AsyncIterator[tuple[SessionManager, SessionManager]]:
    limits = SessionLimits(watchdog_interval_s=0.05)

    def manager(process_id: str) -> SessionManager:
        pipeline = EnginePipeline(FakeEngine())
        return SessionManager(redis, pipeline, max_sessions=4, limits=limits, process_id=process_id)

    async with manager("proc_a") as a, manager("proc_b") as b:
        await a.beat.listening()
        await b.beat.listening()
        yield a, b


async def test_a_session_moves_to_another_manager_and_the_old_copy_lets_go(
    two_managers: tuple[SessionManager, SessionManager], redis: aioredis.Redis
) -> None:
    a, b = two_managers
    async with ClockedSink() as sink:
        session = await created(a, sink)
        await session.add_text("Remember this.")
        keys = SessionKeys(session.session_id)
        assert await redis.hget(keys.meta, "owner") == b"proc_a"
        assert await b.resume(session.session_id, "wrong") is None
        assert await b.resume("sess_nothing", session.resume_token) is None
        start = time.perf_counter()
        moved = await b.resume(session.session_id, session.resume_token)
        print(f"\nmanager resume: {(time.perf_counter() - start) * 1000:.1f} ms")
        assert moved is not None and moved.session_id == session.session_id
        assert len(a) == 0 and session.closed and session.moving
        assert [i.text for i in await moved.history.items()] == ["Remember this."]
        assert await redis.hget(keys.meta, "owner") == b"proc_b"
        assert await redis.zscore("parley:leases", session.session_id) is not None
        # No goodbye: the transport alone hears that the session moved (to tell its client).
        closed = [e for e in sink.events if isinstance(e, SessionClosed)]
        assert [e.reason for e in closed] == ["session_moved"]
        logged = [body["type"] for body in await moved.event_log.replay()]
        assert "session.closed" not in logged and "session.state_changed" not in logged[-1:]
        await b.close_session(moved.session_id)
    assert not await redis.exists(*keys.all())
    assert await redis.zscore("parley:leases", session.session_id) is None


async def test_a_copy_that_missed_its_take_over_ends_without_writing(
    two_managers: tuple[SessionManager, SessionManager], redis: aioredis.Redis
) -> None:
    a, b = two_managers
    async with ClockedSink() as sink:
        session = await created(a, sink)
        await a.beat.stop()  # "dead": no heartbeat, so nobody asks it to let go
        moved = await b.resume(session.session_id, session.resume_token)
        assert moved is not None and not session.closed  # the zombie still runs
        await a._renew(session)  # its next upkeep sees the fence has moved on
        async with asyncio.timeout(5):
            await session.close()
        assert session.moving and len(a) == 0
        assert await redis.hget(SessionKeys(session.session_id).meta, "owner") == b"proc_b"
        log = [body["type"] for body in await moved.event_log.replay()]
        assert "session.closed" not in log
        await b.close_session(moved.session_id)
    assert not await redis.exists(*SessionKeys(session.session_id).all())


async def test_a_hand_over_keeps_the_keys_and_frees_the_owner(
    two_managers: tuple[SessionManager, SessionManager], redis: aioredis.Redis
) -> None:
    a, b = two_managers
    async with ClockedSink() as sink:
        session = await created(a, sink)
        session.movable = True
        assert await a.hand_over_all() == 1
        assert len(a) == 0
        meta = SessionKeys(session.session_id).meta
        assert await redis.hget(meta, "owner") is None and await redis.exists(meta)
        moved = await b.resume(session.session_id, session.resume_token)
        assert moved is not None
        await b.close_session(moved.session_id)


async def test_two_resumes_at_once_leave_one_owner(
    two_managers: tuple[SessionManager, SessionManager], redis: aioredis.Redis
) -> None:
    a, b = two_managers
    async with ClockedSink() as sink:
        session = await created(a, sink)
        token = session.resume_token
        results = await asyncio.gather(
            b.resume(session.session_id, token), b.resume(session.session_id, token)
        )
        won = [s for s in results if s is not None]
        assert len(won) == 1 and len(a) == 0 and len(b) == 1
        assert await won[0].store.owns()
        await b.close_session(session.session_id)
    assert not await redis.exists(*SessionKeys(session.session_id).all())


async def test_a_resume_that_reaches_a_stale_copy_takes_the_session_back(
    two_managers: tuple[SessionManager, SessionManager], redis: aioredis.Redis
) -> None:
    a, b = two_managers
    async with ClockedSink() as sink:
        session = await created(a, sink)
        await a.beat.stop()  # a is not told of the move: its copy goes stale
        assert await b.resume(session.session_id, session.resume_token) is not None
        assert not await b.let_go_if_lost(session.session_id)  # b's is the live one
        assert await a.let_go_if_lost(session.session_id)
        assert session.closed and len(a) == 0
        back = await a.resume(session.session_id, session.resume_token)
        assert back is not None and len(b) == 0  # b was asked to let go, and did
        await a.close_session(session.session_id)
    assert not await redis.exists(*SessionKeys(session.session_id).all())


async def test_a_resume_that_finds_the_session_ended_meanwhile_frees_the_slot(
    two_managers: tuple[SessionManager, SessionManager],
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = two_managers
    async with ClockedSink() as sink:
        session = await created(a, sink)
        token = session.resume_token
        await a.close_session(session.session_id)

        async def ended(session_id: str) -> Takeover:  # the record went between two reads
            return Takeover(0, "")

        async def still_there(session_id: str) -> SessionRecord | None:
            return SessionRecord(session_id, session.config, token)

        monkeypatch.setattr(b.ownership, "take_over", ended)
        monkeypatch.setattr("sessions.manager.read_record", lambda redis, sid: still_there(sid))
        assert await b.resume(session.session_id, token) is None
        assert await b.leases.count() == 0
