"""A session on a full-duplex model (sessions/duplex_turns.py): the model's own turns told as
responses, the user's speech told where it is heard, and no turn of ours.

The model is the scripted duplex (tests/fakes/scripted_duplex.py: the real engine's clock
and streams, a model that answers with a tone a moment after the user stops), behind a
real session, a real Redis and a playout sink; the microphone is real speech.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from loadtest.speech import utterances_with_gaps
from pipeline.capacity import PipelineCapacity
from pipeline.types import OutputChunk, PipelineRequest
from sessions.errors import InvalidRequestError, SessionLimitError
from sessions.events import (
    ConversationItemCreated,
    ErrorEvent,
    OutputAudioDelta,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SpeechStarted,
    SpeechStopped,
)
from sessions.manager import SessionManager
from tests.fakes.scripted_duplex import ScriptedDuplex
from tests.fakes.sink import ClockedSink

from .conftest import feed

QUESTION = "How are you today?"


class DuplexPipeline:
    """A graph with one stage, the duplex model (as StageGraph shows a MoshiStage's)."""

    name = "duplex"

    def __init__(self, model: ScriptedDuplex) -> None:
        self.model = model
        self.engines = {"moshi": self}

    @property
    def duplex(self) -> ScriptedDuplex:
        return self.model

    async def start(self) -> None:
        await self.model.start()

    async def close(self) -> None:
        await self.model.close()

    def active_requests(self) -> int:
        return 0

    async def forget_session(self, session_id: str) -> None:
        return None

    def capacity(self) -> PipelineCapacity | None:
        return None

    async def generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]:
        raise AssertionError("a duplex session never runs a turn of its own")
        yield  # pragma: no cover


@pytest.fixture
async def model() -> AsyncIterator[ScriptedDuplex]:
    model = ScriptedDuplex(rows=2, answer_frames=10, wait_frames=3)
    await model.start()
    yield model
    await model.close()


@pytest.fixture
async def manager(redis: aioredis.Redis, model: ScriptedDuplex) -> AsyncIterator[SessionManager]:
    async with SessionManager(redis, DuplexPipeline(model), max_sessions=4) as manager:
        yield manager


@pytest.fixture
async def sinks() -> AsyncIterator[list[ClockedSink]]:
    made: list[ClockedSink] = []
    yield made
    for sink in made:
        await sink.__aexit__(None, None, None)


async def open_session(
    manager: SessionManager, sinks: list[ClockedSink], config: dict[str, Any] | None = None
) -> tuple[Any, ClockedSink]:
    sink = await ClockedSink().__aenter__()
    sinks.append(sink)
    session = await manager.create(sink, config)
    await sink.wait_for(lambda e: e.type == "session.created")
    return session, sink


def question() -> np.ndarray:
    pcm, _ = utterances_with_gaps([QUESTION], gap_ms=1000, lead_ms=200)
    return pcm


async def test_the_models_turn_is_a_response_and_its_yield_ends_it(
    manager: SessionManager, sinks: list[ClockedSink], model: ScriptedDuplex
) -> None:
    session, sink = await open_session(manager, sinks)
    await feed(session, question(), realtime=True)
    done = await sink.wait_for(lambda e: isinstance(e, ResponseDone), timeout=15)
    assert isinstance(done, ResponseDone) and done.status == "completed"
    types = sink.types()
    # the user's speech where it was heard, as an item; then the model's turn
    assert types.index("input_audio_buffer.speech_started") < types.index("response.created")
    stopped = sink.of(SpeechStopped)[0]
    assert any(
        isinstance(e, ConversationItemCreated) and e.item.id == stopped.item_id for e in sink.events
    )
    created = sink.of(ResponseCreated)[0]
    audio = b"".join(
        e.pcm for e in sink.of(OutputAudioDelta) if e.response_id == created.response_id
    )
    said_ms = 1000 * len(audio) // 2 // 24_000
    assert 800 <= said_ms <= 800 + 8 * 80 + 40  # its 10 frames, and the quiet that ended it
    assert model.answers == 1
    assert session.duplex is not None and session.duplex.turns == 1
    await session.close()
    assert model.sessions == 0  # its place on the model is given back


async def test_talking_over_the_model_does_not_stop_it(
    manager: SessionManager, sinks: list[ClockedSink], model: ScriptedDuplex
) -> None:
    model.answer_frames = 40  # a long answer, to talk over
    session, sink = await open_session(manager, sinks)
    await feed(session, question(), realtime=True)
    await sink.wait_for(lambda e: isinstance(e, ResponseCreated), timeout=15)
    began = len(sink.of(SpeechStarted))
    await feed(session, question()[: 16_000 * 2], realtime=True)  # the user talks on
    done = await sink.wait_for(lambda e: isinstance(e, ResponseDone), timeout=15)
    assert len(sink.of(SpeechStarted)) > began  # heard, and said so
    assert isinstance(done, ResponseDone) and done.status == "completed"  # not cut off
    assert not sink.cleared_at
    await session.close()


async def test_a_cancelled_turn_is_silent_at_once_until_the_model_yields(
    manager: SessionManager, sinks: list[ClockedSink], model: ScriptedDuplex
) -> None:
    model.answer_frames = 30
    session, sink = await open_session(manager, sinks)
    await feed(session, question(), realtime=True)
    created = await sink.wait_for(lambda e: isinstance(e, ResponseCreated), timeout=15)
    await asyncio.sleep(0.3)
    assert await session.cancel_response()
    done = await sink.wait_for(lambda e: isinstance(e, ResponseDone), timeout=5)
    assert isinstance(done, ResponseDone) and done.status == "cancelled"
    assert sink.cleared_at  # the playout was cut at once
    audio_after = len(sink.of(OutputAudioDelta))
    await asyncio.sleep(30 * 0.08)  # the rest of what the model says is dropped
    assert len(sink.of(OutputAudioDelta)) == audio_after
    assert len(sink.of(ResponseCreated)) == 1
    assert isinstance(created, ResponseCreated)
    # the model's next turn is heard again
    await feed(session, question(), realtime=True)
    await sink.wait_for(lambda e: isinstance(e, ResponseCreated) and e is not created, timeout=15)
    await session.close()


async def test_only_the_model_decides_to_speak(
    manager: SessionManager, sinks: list[ClockedSink]
) -> None:
    session, _ = await open_session(manager, sinks)
    with pytest.raises(InvalidRequestError) as refused:
        await session.create_response()
    assert refused.value.code == "duplex_model_decides"
    await session.close()


async def test_a_model_that_fails_under_the_session_ends_it_with_model_error(
    manager: SessionManager, sinks: list[ClockedSink], model: ScriptedDuplex
) -> None:
    """The duplex model's clock dies mid-answer (its frame raising: a seam for a failing
    GPU): the client is told `model_error` in an `error`, the session closes with that
    reason, and a new session is refused while the model is down."""
    session, sink = await open_session(manager, sinks)
    await feed(session, question(), realtime=True)
    await sink.wait_for(lambda e: isinstance(e, ResponseCreated), timeout=15)
    real = model._frame

    def broken(heard: dict[str, Any]) -> Any:
        raise RuntimeError("the frame went wrong")

    model._frame = broken  # type: ignore[method-assign]
    closed = await sink.wait_for(lambda e: isinstance(e, SessionClosed))
    assert isinstance(closed, SessionClosed) and closed.reason == "model_error"
    errors = sink.of(ErrorEvent)
    assert [e.code for e in errors] == ["model_error"]
    assert "frame clock died" in errors[0].message and errors[0].error_type == "server_error"
    with pytest.raises(SessionLimitError, match="cannot serve now"):
        await manager.create(ClockedSink())
    model._frame = real  # type: ignore[method-assign]
    await session.close()
    assert model.sessions == 0
