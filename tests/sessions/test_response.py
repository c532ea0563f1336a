"""A response reports what happened and leaves the session's state to the session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from pipeline.types import PipelineRequest
from sessions import ResponseOptions, SessionConfig
from sessions.clock import ScaledClock
from sessions.events import (
    ConversationItemTruncated,
    Event,
    OutputAudioDelta,
    ResponseCreated,
    ResponseDone,
)
from sessions.history import History
from sessions.keys import SessionKeys
from sessions.response import Response, ResponseContext
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink

CLOCK = ScaledClock(4.0)
"""The engine, the playout and the response run 4 times faster than real time."""


class Reports:
    """What a response told its session, in order."""

    def __init__(self) -> None:
        self.seen: list[Event | str] = []

    def emit(self, event: Event) -> None:
        self.seen.append(event)

    def first_audio(self) -> None:
        self.seen.append("first audio")


@pytest.fixture
async def history(redis: aioredis.Redis) -> AsyncIterator[History]:
    keys = SessionKeys("sess_response_test")
    yield History(redis, keys)
    await redis.delete(*keys.all())


async def request(request_id: str) -> PipelineRequest:
    return PipelineRequest(request_id=request_id, audio=np.zeros(0, dtype=np.int16), text="Hi")


def start(engine: FakeEngine, history: History, sink: ClockedSink, reports: Reports) -> Response:
    context = ResponseContext(
        pipeline=EnginePipeline(engine),
        history=history,
        sink=sink,
        emit=reports.emit,
        first_audio=reports.first_audio,
        chunk_timeout_s=5.0,
        clock=CLOCK,
    )
    options = ResponseOptions().resolve(SessionConfig())
    return Response("resp_test", context, request, transcript_item_id=None, options=options)


async def test_a_completed_answer_reports_its_first_audio_and_returns_after_playout(
    history: History,
) -> None:
    engine, reports = FakeEngine(audio_ms=400, realtime_factor=100.0, clock=CLOCK), Reports()
    async with ClockedSink(clock=CLOCK) as sink:
        response = start(engine, history, sink, reports)
        status = await response.run()
        assert status == "completed" == response.status
        assert sink.playout.queued_ms == 0  # it returned once its audio had played
    first = reports.seen.index("first audio")
    assert isinstance(reports.seen[0], ResponseCreated)
    assert isinstance(reports.seen[first + 1], OutputAudioDelta)  # reported before it is sent
    assert reports.seen.count("first audio") == 1
    assert isinstance(reports.seen[-1], ResponseDone)
    assert response.committed and await history.get(response.item.id) is not None


async def test_a_cancelled_answer_commits_what_was_heard_and_reraises(
    history: History,
) -> None:
    engine, reports = FakeEngine(audio_ms=5_000, realtime_factor=1.0, clock=CLOCK), Reports()
    async with ClockedSink(clock=CLOCK) as sink:
        response = start(engine, history, sink, reports)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(response.run())
            while "first audio" not in reports.seen:
                await asyncio.sleep(0.01)
            await CLOCK.sleep(0.2)
            sink.clear()  # the session clears the sink first, then cancels the turn
            response.cancel_reason = "barge_in"
            task.cancel()
        assert task.cancelled()  # it re-raised the cancellation once it had committed
    done = next(e for e in reports.seen if isinstance(e, ResponseDone))
    assert (done.status, done.reason) == ("cancelled", "barge_in")
    truncated = next(e for e in reports.seen if isinstance(e, ConversationItemTruncated))
    assert isinstance(truncated, ConversationItemTruncated) and truncated.audio_end_ms < 1_000
    assert engine.aborted == ["resp_test"] and not engine.holds("resp_test")
