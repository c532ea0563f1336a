"""A turn's words are recognised at its pauses: partial transcripts while the user speaks,
the final one ready when the turn ends, and nothing kept of a pause the user spoke past."""

from __future__ import annotations

import numpy as np

from loadtest.speech import silence, utterances_with_gaps
from sessions.clock import ScaledClock
from sessions.events import (
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    ResponseDone,
    SpeechStopped,
)
from tests.fakes.fake_engine import FakeEngine

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
    # ... announced before the answer began, after the turn's end.
    types = sink.types()
    assert (
        types.index("input_audio_buffer.speech_stopped")
        < types.index("conversation.item.input_audio_transcription.completed")
        < types.index("response.output_audio_transcript.delta")
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
    assert session._turn_transcript.discarded == 1  # the first pause's work
    (completed,) = sink.of(InputTranscriptionCompleted)  # no answer: transcribed all the same
    (item,) = await session.history.items()
    assert item.text == completed.transcript == f"heard {lengths[1] // 16} ms"
    assert not session._turn_transcript._kept
