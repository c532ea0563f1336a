"""`interruption: "adaptive"` in a whole session (a real Redis, a fake engine, a sink that
plays in real time on a clock 4 times faster): a backchannel over the answer holds it and
loses none of it; a real interruption cuts it as always."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.speech import silence, speak, trim_silence, utterances_with_gaps
from sessions.clock import ScaledClock
from sessions.events import (
    ConversationItemTruncated,
    OutputAudioDelta,
    ResponseDone,
    SessionStateChanged,
    SpeechStarted,
)
from tests.fakes.fake_engine import FakeEngine

from .conftest import MakeSession, feed

CLOCK = ScaledClock(4.0)
ADAPTIVE = {"turn_detection": {"interruption": "adaptive"}}


def question() -> np.ndarray:
    pcm, _ = utterances_with_gaps(["What is the weather like in Paris today?"], 900, 400)
    return pcm


def is_done(event: object) -> bool:
    return isinstance(event, ResponseDone)


async def test_a_backchannel_holds_the_answer_and_loses_none_of_it(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.audio_ms, engine.transcript = 4_000, "Mm-hmm."
    session, sink = await make_session(ADAPTIVE)
    await feed(session, question())
    await sink.wait_for(lambda e: isinstance(e, OutputAudioDelta))
    await session.clock.sleep(1.0)  # a second of the answer plays
    backchannel = np.concatenate([trim_silence(speak("Yeah.")), silence(800)])
    await feed(session, backchannel, realtime=True)
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone) and done.status == "completed"
    await sink.wait_for(lambda e: isinstance(e, SessionStateChanged) and e.state == "listening")
    assert len(sink.of(SpeechStarted)) == 2 and sink.paused_at  # heard over it, and held
    assert not sink.cleared_at and not sink.of(ConversationItemTruncated)
    assert sink.played_audio_frames == 4_000 // 20  # every frame of the answer played
    (answer,) = [item for item in await session.history.items() if item.role == "assistant"]
    assert answer.status == "completed" and answer.audio_ms == 4_000
    assert len(engine.requests) == 1  # no new answer


async def test_a_real_interruption_is_cut_where_it_was_held(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    engine.audio_ms, engine.transcript = 6_000, "Wait, stop."
    session, sink = await make_session(ADAPTIVE)
    await feed(session, question())
    await sink.wait_for(lambda e: isinstance(e, OutputAudioDelta))
    await session.clock.sleep(1.0)
    interruption = np.concatenate([trim_silence(speak("Wait, stop.")), silence(800)])
    await feed(session, interruption, realtime=True)
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone) and done.status == "cancelled"
    assert done.reason == "barge_in"
    truncated = await sink.wait_for(lambda e: isinstance(e, ConversationItemTruncated))
    assert isinstance(truncated, ConversationItemTruncated)
    # Held from the first voiced frame: cut where it was held, not where it was judged.
    assert sink.paused_at[0] < sink.cleared_at[0]
    assert abs(truncated.audio_end_ms - sink.played_ms_at_clear[0]) <= 40
    assert 900 <= truncated.audio_end_ms <= 2_000
    second = await sink.wait_for(lambda e: is_done(e) and e is not done, timeout=15)
    assert isinstance(second, ResponseDone) and len(engine.requests) == 2


@pytest.mark.parametrize(("under_db", "kept"), [(12, True), (0, False)], ids=["far", "near"])
async def test_a_voice_across_the_room_is_kept_however_long(
    make_session: MakeSession, engine: FakeEngine, under_db: int, kept: bool
) -> None:
    """A sentence 12 dB under the user's question (a second voice; past the 700 ms that
    makes the user's own speech a turn, and with words): the answer goes on whole. The same
    sentence at the user's level is a turn: it cuts the answer."""
    engine.audio_ms = 6_000
    engine.transcript = "The train to Glasgow leaves from platform nine."
    session, sink = await make_session(ADAPTIVE)
    await feed(session, question())
    await sink.wait_for(lambda e: isinstance(e, OutputAudioDelta))
    await session.clock.sleep(1.0)
    voice = trim_silence(speak(engine.transcript)).astype(np.float32) * 10 ** (-under_db / 20)
    await feed(session, np.concatenate([voice.astype(np.int16), silence(800)]), realtime=True)
    done = await sink.wait_for(is_done)
    assert isinstance(done, ResponseDone)
    if not kept:
        assert done.status == "cancelled"
        return
    assert done.status == "completed"
    await sink.wait_for(lambda e: isinstance(e, SessionStateChanged) and e.state == "listening")
    assert len(sink.of(SpeechStarted)) == 2 and sink.paused_at  # heard over it, and held
    assert not sink.cleared_at and not sink.of(ConversationItemTruncated)
    assert sink.played_audio_frames == 6_000 // 20
    assert len(engine.requests) == 1
