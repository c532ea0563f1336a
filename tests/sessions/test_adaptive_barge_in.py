"""`interruption: "adaptive"` in turn-taking on its own: speech over an answer holds it,
and the judge's verdict resumes it (a backchannel, a noise) or cuts it (anything more, or
no verdict in time). Real speech (espeak-ng) through the real detector; a scripted
recogniser says what was heard, and when."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest

from loadtest.speech import silence, utterances_with_gaps
from pipeline.types import End, OutputChunk, PipelineRequest, TextDelta
from sessions.events import SpeechStarted, SpeechStopped
from sessions.state import SessionState
from sessions.turn_detection import OVERLAP_PAUSE_MS, PAUSE_MS

from .test_turn_taking import Rig, TinyPipeline, speech

ADAPTIVE = {"type": "server_vad", "interruption": "adaptive"}


class ScriptedRecogniser(TinyPipeline):
    """Hears `heard[n]` the n-th time it is asked (the last one after that), once `release`
    is set if a test holds it."""

    def __init__(self, *heard: str) -> None:
        super().__init__()
        self.heard = list(heard)
        self.asked = 0
        self.release: asyncio.Event | None = None

    async def generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]:
        assert request.transcribe_only
        words = self.heard[min(self.asked, len(self.heard) - 1)]
        self.asked += 1
        if self.release is not None:
            await self.release.wait()
        if words:
            yield TextDelta(words, kind="input_transcript")
        yield End()


@pytest.fixture
async def rigs() -> AsyncGenerator[list[Rig], None]:
    made: list[Rig] = []
    yield made
    for rig in made:
        await rig.close()


def answering(rigs: list[Rig], pipeline: TinyPipeline, **settings: Any) -> Rig:
    """A rig whose session is playing an answer."""
    r = Rig({**ADAPTIVE, **settings}, pipeline=pipeline)
    rigs.append(r)
    r.machine.to(SessionState.THINKING, "response started")
    r.machine.to(SessionState.SPEAKING, "first audio")
    r.host.responding = True
    return r


async def until(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    """Wait (wall time, no input heard) until `condition()`: the recognition asks Silero
    first, in a thread."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)


async def settle(r: Rig, frames: int = 60) -> None:
    """Silence, a frame at a time, letting the recognition run between frames (it asks
    Silero first, in a thread: a few ms of wall time)."""
    for _ in range(frames):
        await r.hear(silence(20))
        await asyncio.sleep(0.005)


async def test_a_backchannel_holds_the_answer_then_resumes_it(rigs: list[Rig]) -> None:
    r = answering(rigs, ScriptedRecogniser("Yeah."))
    await r.hear(speech("Yeah."))
    assert r.host.called("pause_output") == [()]  # silent at once
    assert not r.host.called("interrupt")  # past min_speech_ms, but not judged yet
    assert r.tt.detector is not None
    assert r.tt.detector.pause_ms == OVERLAP_PAUSE_MS  # its words are taken at a longer pause
    await settle(r)
    assert r.host.called("resume_output")  # judged a backchannel: the answer goes on
    await r.hear(silence(20))
    assert r.tt.detector.pause_ms == PAUSE_MS  # a turn's pause again
    assert not r.host.called("interrupt") and not r.host.called("commit_turn")
    assert not r.host.called("respond")
    assert r.machine.state is SessionState.SPEAKING
    (started,) = r.host.of(SpeechStarted)
    (stopped,) = r.host.of(SpeechStopped)  # the pair a client already had for a noise
    assert stopped.item_id == started.item_id
    assert r.tt._overlap.active is False  # type: ignore[attr-defined]


async def test_a_cough_with_no_words_resumes_the_answer(rigs: list[Rig]) -> None:
    r = answering(rigs, ScriptedRecogniser(""))
    await r.hear(speech("Hm."))
    await settle(r)
    assert r.host.called("pause_output") == [()]
    assert r.host.called("resume_output") and not r.host.called("interrupt")


async def test_a_short_command_is_a_real_interruption(rigs: list[Rig]) -> None:
    r = answering(rigs, ScriptedRecogniser("Stop."))
    await r.hear(speech("Stop."))
    await settle(r, frames=10)  # its pause
    await until(lambda: r.host.called("interrupt"))
    assert r.host.called("interrupt") == [()]
    assert r.host.calls.index(("pause_output",)) < r.host.calls.index(("interrupt",))


async def test_long_speech_interrupts_before_its_words_are_known(rigs: list[Rig]) -> None:
    pipeline = ScriptedRecogniser("No, I meant Tuesday.")
    r = answering(rigs, pipeline)
    await r.hear(speech("No, I meant Tuesday."))  # ~1.4 s of voice, no pause in it
    assert r.host.called("interrupt") == [()]  # at 700 ms of voice, not at its end
    assert pipeline.asked == 0


async def test_a_backchannel_followed_by_more_is_judged_again(rigs: list[Rig]) -> None:
    pipeline = ScriptedRecogniser("Yeah.", "Yeah, but what about the price?")
    r = answering(rigs, pipeline)
    pcm, edges = utterances_with_gaps(
        ["Yeah.", "But what about the price?"], gap_ms=350, lead_ms=300
    )
    gap_end = edges[1][0] * 16
    await r.hear(pcm[:gap_end])
    await until(lambda: r.host.called("resume_output"))
    assert not r.host.called("interrupt")
    await r.hear(pcm[gap_end:])  # the voice is back: held at once, and cut
    calls = [c[0] for c in r.host.calls]
    assert calls.count("pause_output") == 2
    assert r.host.called("interrupt") == [()]
    assert len(r.host.of(SpeechStarted)) == 1  # one speech all along


async def test_no_verdict_by_the_deadline_is_an_interruption(rigs: list[Rig]) -> None:
    pipeline = ScriptedRecogniser("Yeah.")
    pipeline.release = asyncio.Event()  # the recogniser never answers
    r = answering(rigs, pipeline, interruption_deadline_ms=800)
    await r.hear(speech("Yeah."))
    (started,) = r.host.of(SpeechStarted)
    for _ in range(100):
        if r.host.called("interrupt"):
            break
        await r.hear(silence(20))
        await asyncio.sleep(0)
    assert r.host.called("interrupt") == [()]
    assert r.turns.offset_ms - started.audio_start_ms == 800  # not a frame later
    assert not r.host.called("resume_output")
    r.machine.to(SessionState.USER_SPEAKING, "barge_in")  # as the session's interrupt does
    await r.silence_until_stopped()  # the speech goes on as the user's turn, from its start
    ((item_id, _, _),) = r.host.called("commit_turn")
    assert item_id == started.item_id and r.host.called("respond")


@pytest.mark.parametrize(("heard", "cut"), [("Yeah.", False), ("Wait.", True)])
async def test_speech_that_ended_before_its_verdict_is_decided_by_it(
    rigs: list[Rig], heard: str, cut: bool
) -> None:
    pipeline = ScriptedRecogniser(heard)
    pipeline.release = asyncio.Event()
    r = answering(rigs, pipeline, interruption_deadline_ms=5000)
    await r.hear(speech(heard))
    await r.silence_until_stopped()  # the silence window passed; the words have not come
    assert not r.host.called("resume_output") and not r.host.called("interrupt")
    pipeline.release.set()
    await until(lambda: r.host.called("interrupt") or r.host.called("resume_output"))
    if cut:
        assert r.host.called("interrupt") == [()]
        ((item_id, _, _),) = r.host.called("commit_turn")
        assert item_id == r.host.of(SpeechStopped)[0].item_id
        assert r.host.called("respond")
    else:
        assert r.host.called("resume_output") and not r.host.called("interrupt")
        assert not r.host.called("commit_turn") and not r.host.called("respond")


async def test_always_cuts_what_adaptive_keeps(rigs: list[Rig]) -> None:
    """The default, OpenAI's meaning: speech lasting min_speech_ms cuts the answer."""
    r = answering(rigs, ScriptedRecogniser("Yeah."), interruption="always")
    await r.hear(speech("Yeah."))
    assert r.host.called("interrupt") == [()]


async def test_a_cleared_buffer_drops_the_judgement(rigs: list[Rig]) -> None:
    """input_audio_buffer.clear while the speech is judged: the speech is gone, the answer
    goes on, and the words that come later decide nothing."""
    pipeline = ScriptedRecogniser("Wait.")
    pipeline.release = asyncio.Event()
    r = answering(rigs, pipeline)
    await r.hear(speech("Wait."))
    await settle(r, frames=10)  # past the pause (OVERLAP_PAUSE_MS): the words are on their way
    await until(lambda: pipeline.asked == 1)
    await r.tt.clear()
    assert r.host.called("resume_output")
    pipeline.release.set()
    await settle(r, frames=5)
    assert not r.host.called("interrupt")


async def test_a_clatter_whisper_writes_words_for_is_still_a_noise(rigs: list[Rig]) -> None:
    """Whisper writes "you" or "Thank you." for a clatter or a cough: Silero hears no
    speech in it, so it is a noise, kept without asking the recogniser."""
    import numpy as np
    import soxr

    from loadtest.interruption_set import RATE, noise_burst

    clatter = noise_burst("clatter", np.random.default_rng(3)).pcm
    pcm = soxr.resample(np.asarray(clatter), RATE, 16_000).astype(np.int16)
    pipeline = ScriptedRecogniser("Thank you.")
    r = answering(rigs, pipeline)
    await r.hear(np.concatenate([silence(300), pcm]))
    await settle(r)
    assert r.host.called("pause_output") == [()]  # the level-gated VAD took it for a voice
    assert r.host.called("resume_output") and not r.host.called("interrupt")
    assert pipeline.asked == 0
