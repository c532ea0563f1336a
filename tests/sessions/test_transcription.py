"""Transcripts carry their tokens' log-probabilities when the session includes them
(`item.input_audio_transcription.logprobs`), whichever path recognises the turn: a
committed turn's transcription, the words at a pause, an answer's; and none when it does not.
The fake engine's recogniser gives a word a token (tests/fakes/fake_engine.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loadtest.speech import silence, utterances_with_gaps
from pipeline.types import TokenLogprob
from sessions.clock import ScaledClock
from sessions.events import InputTranscriptionCompleted, InputTranscriptionDelta, ResponseDone
from sessions.transcription import tokens_after
from tests.fakes.fake_engine import FakeEngine, fake_tokens

from .conftest import MakeSession, feed

CLOCK = ScaledClock(4.0)
INCLUDE = {"include": ["item.input_audio_transcription.logprobs"]}


def test_a_deltas_tokens_are_those_past_what_was_sent() -> None:
    tokens = fake_tokens("Hello there, how are you")
    assert tokens_after(tokens, "") == tokens
    assert tokens_after(tokens, "Hello there,") == tokens[2:]
    assert tokens_after(tokens, "Hello the") == tokens[1:]  # " there," completes past it
    assert tokens_after(tokens, "Hello there, how are you") == ()
    assert tokens_after(None, "Hello") is None
    cafe = (TokenLogprob("caf", -0.1, b"caf"), TokenLogprob("\ufffd", -0.2, b"\xc3"))
    assert tokens_after((*cafe, TokenLogprob("\ufffd", -0.3, b"\xa9")), "caf") == cafe[1:] + (
        TokenLogprob("\ufffd", -0.3, b"\xa9"),
    )  # bytes, not characters, say where a token ends


def joined(event: InputTranscriptionDelta | InputTranscriptionCompleted) -> str:
    assert event.logprobs is not None, event
    return "".join(token.token for token in event.logprobs)


def one_phrase() -> np.ndarray[Any, np.dtype[np.int16]]:
    pcm, _ = utterances_with_gaps(["What is the capital of France?"], gap_ms=0, lead_ms=400)
    return np.concatenate([pcm, silence(1200, 16_000)])


@pytest.mark.parametrize("include", [True, False])
async def test_a_committed_turns_transcript_has_its_tokens_if_included(
    make_session: MakeSession, include: bool
) -> None:
    """No turn detection: the client commits, and the turn is transcribed on its own."""
    config: dict[str, Any] = {"turn_detection": None, **(INCLUDE if include else {})}
    session, sink = await make_session(config)
    await feed(session, one_phrase())
    await session.commit_audio()
    completed = await sink.wait_for(lambda e: isinstance(e, InputTranscriptionCompleted))
    assert isinstance(completed, InputTranscriptionCompleted)
    (delta,) = sink.of(InputTranscriptionDelta)
    if not include:
        assert delta.logprobs is None and completed.logprobs is None
        return
    assert joined(delta) == delta.delta == joined(completed) == completed.transcript
    assert delta.logprobs == completed.logprobs


async def test_the_words_at_a_pause_have_their_tokens_in_each_delta(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    """Server VAD with no answers: the words at the pause are the partial and the final."""
    turn_detection = {"turn_detection": {"create_response": False}}
    session, sink = await make_session({**turn_detection, **INCLUDE})
    await feed(session, one_phrase(), realtime=True)
    completed = await sink.wait_for(lambda e: isinstance(e, InputTranscriptionCompleted))
    assert isinstance(completed, InputTranscriptionCompleted)
    deltas = sink.of(InputTranscriptionDelta)
    assert deltas and all(joined(delta) == delta.delta for delta in deltas)
    assert joined(completed) == completed.transcript
    assert all(request.recognition.logprobs for request in engine.transcriptions)


async def test_an_answered_turns_transcript_has_its_tokens(
    make_session: MakeSession, engine: FakeEngine
) -> None:
    session, sink = await make_session(INCLUDE)
    await feed(session, one_phrase(), realtime=True)
    await sink.wait_for(lambda e: isinstance(e, ResponseDone))
    (completed,) = sink.of(InputTranscriptionCompleted)
    assert joined(completed) == completed.transcript
    assert all(request.recognition.logprobs for request in engine.requests)
