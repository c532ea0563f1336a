"""A turn's words are recognised at its pauses: partial transcripts while the user speaks,
the final one ready when the turn ends, and nothing kept of a pause the user spoke past."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.speech import silence, utterances_with_gaps
from sessions.clock import ScaledClock
from sessions.events import (
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    ResponseCreated,
    ResponseDone,
    SpeechStopped,
)
from sessions.turn_end import sounds_finished
from sessions.turn_taking import ServerTurnTaking
from tests.fakes.fake_engine import FakeEngine
from tests.metrics import metric_value

from .conftest import MakeSession, feed

CLOCK = ScaledClock(4.0)


async def test_the_words_are_ready_when_the_turn_ends(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    session, sink = await make_session()
    pcm, _ = utterances_with_gaps(["What is the capital of France?"], gap_ms=900, lead_ms=400)
    await feed(session, pcm, realtime=True)
    done = await sink.wait_for(lambda e: isinstance(e, ResponseDone))
    assert isinstance(done, ResponseDone) and done.status == "completed"
    # One transcription, begun at the pause; the answer's request carried its words.
    assert len(engine.transcriptions) == 1
    (request,) = engine.requests
    completed = sink.of(InputTranscriptionCompleted)
    assert len(completed) == 1 and request.transcript == completed[0].transcript
    # ... final at the turn's end: announced right after speech_stopped, before the answer.
    types = sink.types()
    assert (
        types.index("input_audio_buffer.speech_stopped")
        < types.index("conversation.item.input_audio_transcription.completed")
        < types.index("response.created")
    )


async def test_a_mid_turn_pause_gives_a_partial_and_speaking_on_discards_it(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """Two phrases 300 ms apart: a pause (160 ms) but not the end (500 ms). The first
    phrase's words arrive as a partial transcript while the user still speaks; the turn's
    end is recognised again on all of it."""
    session, sink = await make_session({"turn_detection": {"create_response": False}})
    pcm, _ = utterances_with_gaps(["Hello there.", "How are you today?"], gap_ms=300, lead_ms=400)
    await feed(session, np.concatenate([pcm, silence(1200, 16_000)]), realtime=True)
    await sink.wait_for(lambda e: isinstance(e, InputTranscriptionCompleted))
    stopped = sink.of(SpeechStopped)
    assert len(stopped) == 1  # one turn
    deltas = sink.of(InputTranscriptionDelta)
    assert deltas
    assert sink.events.index(deltas[0]) < sink.events.index(stopped[0])  # while speaking
    lengths = [len(r.audio) for r in engine.transcriptions]
    assert len(lengths) == 2 and lengths[1] > lengths[0]  # the end heard all of it, once
    assert isinstance(session.turn_taking, ServerTurnTaking)
    assert session.turn_taking.transcript.discarded == 1  # the first pause's work
    (completed,) = sink.of(InputTranscriptionCompleted)  # no answer: transcribed all the same
    (item,) = await session.history.items()
    assert item.text == completed.transcript == f"heard {lengths[1] // 16} ms"
    assert not session.turn_taking.transcript._kept


@pytest.mark.parametrize(
    ("words", "finished"),
    [
        ("What is the capital of France?", True),
        ("how are you", True),
        ("what is that", True),
        ("Set a timer for ten minutes.", True),
        ("I would like to go to the", False),
        ("Tell me about", False),
        ("and then, um", False),
        ("so I was thinking that it's", False),
        ("", None),
    ],
)
def test_the_words_say_whether_a_turn_sounds_finished(words: str, finished: bool | None) -> None:
    assert sounds_finished(words) is finished


async def silence_before_the_end(
    make_session: MakeSession,
    engine: FakeEngine,
    heard: str,
    eagerness: str,
    verdict: str | None = None,
) -> int:
    """Feed one phrase and then silence; return how much silence passed before the turn
    ended (speech_stopped), on the audio timeline. `verdict`: the pipeline's own judgement
    of the words (None: it has none, the session's rule judges)."""
    vad = {"type": "semantic_vad", "eagerness": eagerness, "create_response": False}
    session, sink = await make_session({"turn_detection": vad})
    engine.transcript, engine.turn_end = heard, verdict
    pcm, _ = utterances_with_gaps(["What is the capital of France?"], gap_ms=0, lead_ms=400)
    await feed(session, pcm, realtime=True)
    for _ in range(150):  # up to 3 s of silence, 20 ms at a time, at microphone pace
        if sink.of(SpeechStopped):
            break
        await feed(session, silence(20, 16_000), realtime=True)
    (stopped,) = sink.of(SpeechStopped)
    return session._turns.offset_ms - stopped.audio_end_ms


async def test_semantic_vad_ends_a_finished_question_sooner_than_a_broken_off_one(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    finished = await silence_before_the_end(
        make_session, engine, "what is the capital of france", "medium"
    )
    broken_off = await silence_before_the_end(
        make_session, engine, "what is the capital of the", "medium"
    )
    # medium waits 700 ms on silence alone; the words end one sooner, the other later
    assert finished < 700 < broken_off, (finished, broken_off)


async def test_the_pipelines_verdict_on_the_words_outranks_the_rule(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """ "set a timer" sounds whole to the last-word rule; a pipeline that judges it broken
    off (the cascade's SmolLM2 can) makes the turn wait, and one that judges it whole ends it."""
    waited = await silence_before_the_end(
        make_session, engine, "set a timer", "medium", verdict="unfinished"
    )
    ended = await silence_before_the_end(
        make_session, engine, "what is the capital of the", "medium", verdict="finished"
    )
    assert ended < 700 < waited, (ended, waited)
    assert all(t.judge_turn_end for t in engine.transcriptions)


async def test_semantic_vad_high_waits_for_the_words_verdict(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """high's window (350 ms) ends before the words at the pause are judged (~250 ms after
    it, here the fake's 300 ms): the end is held for the verdict, so a broken-off sentence
    still waits."""
    engine.first_chunk_delay_s = 0.3
    broken_off = await silence_before_the_end(
        make_session, engine, "what is the capital of the", "high", verdict="unfinished"
    )
    assert broken_off >= 700, broken_off


async def test_an_answer_begun_at_the_pause_is_kept_or_thrown_away(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """Two phrases 300 ms apart, then the end: the answer begun at the first pause is
    aborted when the user speaks on (nothing of it reaches the client); the one begun at
    the last pause is the answer."""
    session, sink = await make_session()
    pcm, _ = utterances_with_gaps(["Hello there.", "How are you today?"], gap_ms=300, lead_ms=400)
    await feed(session, np.concatenate([pcm, silence(1200, 16_000)]), realtime=True)
    await sink.wait_for(lambda e: isinstance(e, ResponseDone))
    assert len(sink.of(ResponseCreated)) == 1  # one answer, to the whole turn
    kept = metric_value(session.metrics.prefetches.labels("kept"))
    discarded = metric_value(session.metrics.prefetches.labels("discarded"))
    assert (kept, discarded) == (1, 1)
    first, last = engine.requests
    assert first.request_id in engine.aborted and len(last.audio) > len(first.audio)
    assert engine.active_requests() == 0
