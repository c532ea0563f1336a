"""A session end to end with real speech, a real Redis and a fake engine behind it.

The session, the engine, the playout and the microphone run on a `ScaledClock` (`CLOCK`, 4 times
faster than real time): every limit, pace and assertion is in the scenario's own time, and
turn detection works on audio offsets, so the scenarios mean what they would at speed 1.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import redis.asyncio as aioredis

from loadtest.speech import silence, speak, trim_silence, utterances_with_gaps
from pipeline.engine_pipeline import EnginePipeline
from sessions import ResponseOptions
from sessions.clock import ScaledClock
from sessions.errors import ConfigError, InvalidRequestError, MediaError, SessionClosedError
from sessions.events import (
    AudioBufferCommitted,
    ConversationItemTruncated,
    ErrorEvent,
    InputTranscriptionCompleted,
    OutputAudioDelta,
    OutputAudioTranscriptDelta,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionExpiring,
    SessionStateChanged,
)
from sessions.manager import SessionManager
from sessions.state import SessionState
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink
from web.redis_server import EmbeddedRedis

from .conftest import MakeSession, feed

QUESTION = "What is the weather like in Paris today?"

CLOCK = ScaledClock(4.0)
"""These scenarios run 4 times faster than real time (conftest's fixtures run on it)."""


def spoken_turn() -> tuple[np.ndarray, tuple[int, int]]:
    pcm, edges = utterances_with_gaps([QUESTION], gap_ms=900, lead_ms=400)
    return pcm, edges[0]


def is_done(event: object) -> bool:
    return isinstance(event, ResponseDone)


async def test_spoken_turn_gets_a_streamed_answer(
    make_session: MakeSession, engine: FakeEngine, redis: aioredis.Redis
) -> None:
    session, sink = await make_session()
    pcm, (start, end) = spoken_turn()
    await feed(session, pcm)
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone) and done.status == "completed"
    types = sink.types()
    for expected in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.created",
        "response.created",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.done",
    ):
        assert expected in types, expected
    assert (
        types.index("input_audio_buffer.speech_started")
        < types.index("input_audio_buffer.committed")
        < types.index("response.created")
        < types.index("response.done")
    )
    # The engine got the turn's audio with its prefix padding, and nothing much more.
    (request,) = engine.requests
    turn_ms = len(request.audio) / 16
    assert end - start + 300 - 60 <= turn_ms <= end - start + 300 + 900 + 60
    transcript = "".join(e.delta for e in sink.of(OutputAudioTranscriptDelta))
    assert transcript.strip() == engine.text
    # After playout the session listens again, and the answer is in the history.
    await sink.wait_for(
        lambda e: (
            isinstance(e, SessionStateChanged) and e.state == "listening" and "response" in e.reason
        )
    )
    assert sink.played_audio_frames >= 2000 // 20 - 1
    # The session made every transition, in order; it was speaking before the first audio.
    changes = sink.of(SessionStateChanged)
    assert [(e.previous, e.state, e.reason) for e in changes] == [
        ("listening", "user_speaking", "speech started"),
        ("user_speaking", "thinking", "response started"),
        ("thinking", "speaking", "first audio"),
        ("speaking", "listening", "response completed"),
    ]
    assert sink.events.index(changes[2]) < sink.events.index(sink.of(OutputAudioDelta)[0])
    roles = [(item.role, item.text) for item in await session.history.items()]
    # The user's words were recognised at the pause before the turn ended (the fake engine
    # "hears" the length of what it is given) and the answer's request carried them.
    assert [role for role, _ in roles] == ["user", "assistant"]
    assert roles[0][1].startswith("heard ") and roles[1][1] == engine.text
    assert request.transcript == roles[0][1]


@pytest.mark.slow
async def test_barge_in_cancels_and_truncates_at_the_played_position(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.audio_ms = 6_000
    session, sink = await make_session()
    pcm, _ = spoken_turn()
    await feed(session, pcm)
    await sink.wait_for(lambda e: isinstance(e, OutputAudioDelta))
    await session.clock.sleep(1.0)  # let about a second of the answer play
    interruption = np.concatenate(
        [trim_silence(speak("Stop, stop, wait a moment please.")), silence(800)]
    )
    frames_before = sink.played_audio_frames
    async with asyncio.TaskGroup() as tg:  # the feed ends with the block, a failure's too
        tg.create_task(feed(session, interruption, realtime=True))
        done = await sink.wait_for(is_done)
        # Output stopped within a frame of the clear.
        await session.clock.sleep(0.2)
        assert sink.played_audio_frames - frames_before < 200 // 20 * 20  # sanity
        assert sink.cleared_at and sink.last_audio_at is not None
        assert sink.last_audio_at - sink.cleared_at[0] <= 0.045
        # Playback paused as soon as the speech began, before it was long enough to cut.
        assert sink.paused_at and sink.paused_at[0] < sink.cleared_at[0] - 0.1
    assert isinstance(done, ResponseDone)
    assert done.status == "cancelled" and done.reason == "barge_in"
    truncated = await sink.wait_for(lambda e: isinstance(e, ConversationItemTruncated))
    assert isinstance(truncated, ConversationItemTruncated)
    # Cut where playback stopped: about a second in, never the whole answer.
    assert 900 <= truncated.audio_end_ms <= 2_200
    assert abs(truncated.audio_end_ms - sink.played_ms_at_clear[0]) <= 40
    first_request = engine.requests[0].request_id
    assert first_request in engine.aborted and not engine.holds(first_request)
    answer = await session.history.get(truncated.item_id)
    assert answer is not None
    assert answer.status == "incomplete" and answer.audio_ms == truncated.audio_end_ms
    assert len(answer.text) < len(engine.text)
    # The interruption became the next user turn and got its own answer.
    second = await sink.wait_for(
        lambda e: isinstance(e, ResponseDone) and e is not done, timeout=15
    )
    assert isinstance(second, ResponseDone) and second.status == "completed"
    # Two answers, the one cut and the interruption's own: any begun at a pause inside the
    # interruption was dropped unheard as the user spoke on, and none is still held.
    assert len(sink.of(ResponseDone)) == 2
    assert not any(engine.holds(r.request_id) for r in engine.requests)


@pytest.mark.parametrize("final_words", ["What is the capital of France?", "What is the capital"])
async def test_an_answer_begun_on_a_draft_is_heard_only_if_the_final_words_agree(
    make_session: MakeSession, engine: FakeEngine, final_words: str
) -> None:
    """The recogniser's quick draft comes at once, its final words only after the turn has
    ended: the answer begun on the draft waits for them, and is the one heard only if they
    are the same words; else the answer is made afresh on the final words, which are the
    turn's transcript either way."""
    engine.draft, engine.transcript = "what is the capital of france", final_words
    engine.final_delay_s = 1.0  # past the 500 ms silence window
    session, sink = await make_session()
    await feed(session, spoken_turn()[0], realtime=True)  # the draft comes at the pause
    done = await sink.wait_for(is_done, timeout=15)
    assert isinstance(done, ResponseDone) and done.status == "completed"
    (heard,) = sink.of(InputTranscriptionCompleted)
    assert heard.transcript == final_words
    assert len(sink.of(ResponseCreated)) == 1
    answered = [r.transcript for r in engine.requests]
    if final_words.lower().rstrip("?") == engine.draft:  # the same words: the draft's answer
        assert answered == [engine.draft]
    else:  # begun on the draft, then made again on the final words
        assert answered == [engine.draft, final_words]
    assert not any(engine.holds(r.request_id) for r in engine.requests)


async def test_noise_shorter_than_min_speech_does_not_interrupt(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.audio_ms = 3_000
    session, sink = await make_session({"turn_detection": {"min_speech_ms": 600}})
    await feed(session, spoken_turn()[0])
    await sink.wait_for(lambda e: isinstance(e, OutputAudioDelta))
    blip = np.concatenate([trim_silence(speak("Hm."))[:3200], silence(700)])  # ~200 ms
    await feed(session, blip, realtime=True)
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone) and done.status == "completed"
    assert not sink.of(ConversationItemTruncated)


async def test_manual_turns_and_text_messages(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    session, sink = await make_session({"turn_detection": None})
    await feed(session, spoken_turn()[0])
    assert "input_audio_buffer.speech_started" not in sink.types()
    item = await session.commit_audio()
    assert sink.of(AudioBufferCommitted)
    await session.create_response()
    await sink.wait_for(is_done)
    assert len(engine.requests[0].audio) / 16 == pytest.approx(item.audio_ms, abs=20)
    # A typed message is answered with the history as context.
    await session.add_text("And tomorrow?")
    with pytest.raises(InvalidRequestError, match="at least 100 ms"):
        await session.commit_audio()  # nothing new buffered
    await sink.wait_for(lambda e: isinstance(e, SessionStateChanged) and e.state == "listening")
    await session.create_response()
    with pytest.raises(InvalidRequestError, match="already has an active response"):
        await session.create_response()
    await sink.wait_for(lambda e: isinstance(e, ResponseDone) and len(sink.of(ResponseDone)) == 2)
    second = engine.requests[1]
    assert second.text == "And tomorrow?"
    assert [h.role for h in second.history] == ["assistant"]


async def test_response_cancel_and_text_only_output(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.audio_ms = 5_000
    session, sink = await make_session({"output_modalities": ["text"]})
    await session.add_text("Tell me a story.")
    await session.create_response()
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone) and done.status == "completed"
    assert "response.output_text.delta" in sink.types()
    assert not sink.of(OutputAudioDelta)
    await session.update({"output_modalities": ["audio"]})
    await session.create_response()
    await sink.wait_for(lambda e: isinstance(e, OutputAudioDelta))
    assert await session.cancel_response()
    cancelled = await sink.wait_for(
        lambda e: isinstance(e, ResponseDone) and e.status == "cancelled"
    )
    assert isinstance(cancelled, ResponseDone) and cancelled.reason == "client_cancelled"
    assert session.state is SessionState.LISTENING
    assert not await session.cancel_response()


async def test_a_failing_engine_fails_the_response_not_the_session(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.fail_with = "out of memory"
    session, sink = await make_session()
    await session.add_text("hello")
    await session.create_response()
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone) and done.status == "failed"
    assert "out of memory" in done.reason
    # The client hears of it as an error too, not only inside response.done.
    (error,) = [e for e in sink.events if isinstance(e, ErrorEvent)]
    assert (error.code, error.error_type) == ("model_error", "server_error")
    assert "out of memory" in error.message
    assert sink.events.index(error) < sink.events.index(done)
    assert session.state is SessionState.LISTENING
    engine.fail_with = None
    await session.create_response()
    await sink.wait_for(lambda e: isinstance(e, ResponseDone) and e.status == "completed")


async def test_bad_input_gets_typed_errors_and_loses_nothing(make_session: MakeSession) -> None:
    session, _ = await make_session({"turn_detection": None})
    good = (np.arange(3200) % 100).astype(np.int16)
    await session.append_audio(good.tobytes(), 16_000, 1)
    with pytest.raises(MediaError, match="empty"):
        await session.append_audio(b"", 16_000, 1)
    with pytest.raises(MediaError, match="MiB|bytes"):
        await session.append_audio(b"\0" * (1024 * 1024 + 2), 16_000, 1)
    with pytest.raises(MediaError, match="PCM16"):
        await session.append_audio(b"\0\0\0", 16_000, 1)
    with pytest.raises(MediaError, match="rate"):
        await session.append_audio(b"\0\0", 12_345, 1)
    with pytest.raises(MediaError):
        await session.add_frame(b"garbage")
    with pytest.raises(ConfigError, match=r"video\.num_frames: must be between 1 and 128"):
        await session.update({"video": {"num_frames": 500}})
    assert session.config.video.num_frames == 4
    # What was buffered before is intact.
    assert np.array_equal(await session.audio.read(0, 200), good)
    await session.close()
    with pytest.raises(SessionClosedError):
        await session.append_audio(good.tobytes(), 16_000, 1)


async def test_close_removes_every_key_task_and_lease(
    make_session: MakeSession, manager: SessionManager, redis: aioredis.Redis
) -> None:
    session, sink = await make_session()
    await feed(session, spoken_turn()[0])
    await sink.wait_for(lambda e: isinstance(e, OutputAudioDelta))
    assert await redis.keys(f"*{session.session_id}*")
    await manager.close_session(session.session_id)
    await manager.close_session(session.session_id)  # idempotent
    await session.close()
    assert await redis.keys(f"*{session.session_id}*") == []
    assert await manager.leases.count() == 0
    assert session.state is SessionState.CLOSED
    closed = sink.of(SessionClosed)
    assert len(closed) == 1 and sink.events[-1] is closed[0]
    assert [e.status for e in sink.of(ResponseDone)] == ["cancelled"]


async def test_idle_timeout_closes_a_silent_session(
    manager: SessionManager, make_session: MakeSession
) -> None:
    manager.limits = type(manager.limits)(idle_timeout_s=0.3, watchdog_interval_s=0.05)
    session, sink = await make_session()
    closed = await sink.wait_for(lambda e: isinstance(e, SessionClosed), timeout=5)
    assert isinstance(closed, SessionClosed) and closed.reason == "idle_timeout"
    await session.close()
    assert len(manager) == 0


async def test_an_answer_generating_or_playing_is_not_idle(
    manager: SessionManager, make_session: MakeSession, engine: FakeEngine
) -> None:
    """A client that only listens to an answer longer than the idle timeout hears all of
    it; the idle time counts from the end of its playback."""
    manager.limits = type(manager.limits)(idle_timeout_s=0.3, watchdog_interval_s=0.05)
    engine.realtime_factor = 1.0  # 2 s of audio made and played in real time
    session, sink = await make_session()
    await session.add_text("Tell me a story.")
    await session.create_response()
    done = await sink.wait_for(is_done, timeout=10)
    assert isinstance(done, ResponseDone) and done.status == "completed"
    closed = await sink.wait_for(lambda e: isinstance(e, SessionClosed), timeout=10)
    assert isinstance(closed, SessionClosed) and closed.reason == "idle_timeout"
    assert sink.played_ms >= 2000  # every bit of the answer played before the end
    (told,) = sink.of(ErrorEvent)
    assert told.code == "session_idle_timeout"


async def test_lifetime_warning_then_close(
    manager: SessionManager, make_session: MakeSession
) -> None:
    manager.limits = type(manager.limits)(
        max_lifetime_s=0.6, lifetime_warning_s=0.4, watchdog_interval_s=0.05
    )
    session, sink = await make_session()
    warning = await sink.wait_for(lambda e: isinstance(e, SessionExpiring), timeout=5)
    assert isinstance(warning, SessionExpiring) and warning.seconds_left <= 1
    closed = await sink.wait_for(lambda e: isinstance(e, SessionClosed), timeout=5)
    assert isinstance(closed, SessionClosed) and closed.reason == "max_duration"
    (told,) = sink.of(ErrorEvent)  # every protocol's client reads why
    assert told.code == "session_expired" and "maximum duration" in told.message


async def test_a_redis_outage_does_not_end_the_call(engine: FakeEngine) -> None:
    """Redis dies after a long turn's audio was stored: that answer fails (its audio is
    out of reach: only the last 10 s are kept in memory) and says why, the client hears of
    the outage once, and the session lives."""
    with EmbeddedRedis() as private:
        client = aioredis.Redis.from_url(private.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            async with (
                SessionManager(client, EnginePipeline(engine), clock=CLOCK) as manager,
                ClockedSink(clock=CLOCK) as sink,
            ):
                session = await manager.create(sink, {"turn_detection": None})
                await sink.wait_for(lambda e: e.type == "session.created")
                long_turn = np.concatenate([silence(10_000), spoken_turn()[0]])
                await feed(session, long_turn)  # stored in Redis
                private.stop()
                await session.commit_audio()
                await session.create_response()
                done = await sink.wait_for(is_done)
                assert isinstance(done, ResponseDone) and done.status == "failed"
                assert done.reason.startswith("redis_unavailable: could not prepare the request")
                errors = [e for e in sink.events if isinstance(e, ErrorEvent)]
                assert [(e.code, e.error_type) for e in errors] == [
                    ("redis_unavailable", "server_error")
                ]
                await sink.wait_for(
                    lambda e: isinstance(e, SessionStateChanged) and e.state == "listening"
                )
                registry = manager.metrics.registry
                assert (registry.get_sample_value("parley_redis_errors_total") or 0) >= 1
                await manager.close_session(session.session_id)
                assert isinstance(sink.events[-1], SessionClosed)
        finally:
            await client.aclose()


@pytest.mark.slow
async def test_barge_in_after_generation_truncates_what_is_still_playing(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """A fast model finishes long before its audio has played: speaking then still cuts it."""
    engine.audio_ms, engine.realtime_factor = 6_000, 1_000.0
    session, sink = await make_session()
    await feed(session, spoken_turn()[0])
    done = await sink.wait_for(is_done)  # the last 2 s are still queued for playout
    assert isinstance(done, ResponseDone) and done.status == "completed"
    interruption = np.concatenate([trim_silence(speak("Wait, stop there.")), silence(800)])
    await feed(session, interruption, realtime=True)
    truncated = await sink.wait_for(lambda e: isinstance(e, ConversationItemTruncated))
    assert isinstance(truncated, ConversationItemTruncated)
    assert 3_000 <= truncated.audio_end_ms <= 5_800
    answer = await session.history.get(truncated.item_id)
    assert answer is not None and answer.status == "incomplete"
    assert answer.audio_ms == truncated.audio_end_ms


async def test_a_detached_session_waits_for_its_client_then_closes(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.audio_ms = 5_000
    session, sink = await make_session()
    await session.add_text("Tell me something long.")
    await session.create_response()
    await sink.wait_for(lambda e: isinstance(e, OutputAudioDelta))
    await session.detach(grace_s=0.5)  # the connection dropped mid-answer
    assert not session.responding
    assert session.matches_token(session.resume_token) and not session.matches_token("nope")
    back = ClockedSink()
    session.attach(back)  # the client came back in time
    await session.add_text("Still there?")
    await session.clock.sleep(0.8)
    assert not session.closed
    await session.detach(grace_s=0.3)  # gone for good this time
    async with asyncio.timeout(5):
        while not session.closed:
            await asyncio.sleep(0.05)
    assert session.close_reason == "client_gone"
    assert not any(isinstance(e, SessionClosed) for e in back.events)  # nobody was there


async def test_items_can_be_deleted_from_the_conversation(make_session: MakeSession) -> None:
    session, sink = await make_session({"turn_detection": None})
    item = await session.add_text("Forget I said this.")
    await session.delete_item(item.id)
    assert await session.history.items() == []
    assert any(e.type == "conversation.item.deleted" for e in sink.events)
    with pytest.raises(InvalidRequestError, match="no item"):
        await session.delete_item(item.id)


async def test_speech_then_a_typed_question_is_one_turn(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    session, sink = await make_session({"turn_detection": None})
    await feed(session, spoken_turn()[0])
    speech = await session.commit_audio()
    await session.add_text("What was that?")
    await session.create_response()
    await sink.wait_for(is_done)
    request = engine.requests[0]
    assert request.text == "What was that?"
    assert len(request.audio) / 16 == pytest.approx(speech.audio_ms, abs=20)
    assert request.history == ()  # neither half of the turn is history yet


@pytest.mark.parametrize(("eagerness", "turns"), [("low", 1), ("high", 2)])
async def test_semantic_vad_eagerness_decides_where_a_turn_ends(
    make_session: MakeSession, engine: FakeEngine, eagerness: str, turns: int
) -> None:
    """A 900 ms pause between two sentences: `low` (a 1.2 s window) waits it out as one
    turn, `high` (350 ms) answers the first sentence. (No words are recognised here, so
    the silence alone decides; test_turn_transcript.py has the words' part.)"""
    engine.transcript = ""
    vad = {"type": "semantic_vad", "eagerness": eagerness, "create_response": False}
    session, sink = await make_session({"turn_detection": vad})
    pcm, _ = utterances_with_gaps(["Hello there.", "How are you today?"], gap_ms=900, lead_ms=400)
    await feed(session, np.concatenate([pcm, silence(1500, 16_000)]))
    assert sink.types().count("input_audio_buffer.speech_stopped") == turns


async def test_response_metadata_is_carried_to_its_events(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    session, sink = await make_session({"turn_detection": None})
    await session.add_text("Hello?")
    await session.create_response(ResponseOptions(metadata={"client_event_id": "c1"}))
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone) and done.metadata == {"client_event_id": "c1"}
    (created,) = sink.of(ResponseCreated)
    assert created.metadata == {"client_event_id": "c1"}
