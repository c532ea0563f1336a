"""Turn-taking on its own: no transport, no Redis, no response. A stand-in host records
what turn-taking asks of its session, a tiny pipeline recognises the words at a pause, and
real speech (espeak-ng) goes through the real detector."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from loadtest.speech import silence, utterances_with_gaps
from pipeline.capacity import PipelineCapacity
from pipeline.types import End, ErrorChunk, OutputChunk, PipelineRequest, TextDelta
from sessions.clock import ScaledClock
from sessions.config import TurnDetectionConfig
from sessions.errors import InvalidRequestError
from sessions.events import (
    AudioBufferCleared,
    ConversationItem,
    Event,
    InputAudioTimeoutTriggered,
    SpeechStarted,
    SpeechStopped,
)
from sessions.metrics import SessionMetrics
from sessions.prefetch import Prefetch
from sessions.state import SessionState, StateMachine
from sessions.transcription import Heard
from sessions.turn_taking import ModelTurnTaking, ServerTurnTaking, TurnTaking
from sessions.turns import Turns

FRAME = 320  # samples: 20 ms at 16 kHz


class StandInSink:
    """The client's output: only whether it was paused or resumed matters here."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self._calls = calls

    def pause(self) -> None:
        self._calls.append(("pause_output",))

    def resume(self) -> None:
        self._calls.append(("resume_output",))

    async def audio(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        return None

    def event(self, event: Event) -> None:
        return None

    def clear(self) -> None:
        return None

    @property
    def played_ms(self) -> int:
        return 0

    async def drained(self) -> None:
        return None


class StandInHost:
    """What a session does for turn-taking, written down instead of done."""

    def __init__(self) -> None:
        self.responding = False
        self.closing = False
        self.events: list[Event] = []
        self.calls: list[tuple[Any, ...]] = []
        self.responded = asyncio.Event()
        self.keep_prefetched = False
        """The answer begun ahead stays for the test to adopt (else it is discarded)."""

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [c[1:] for c in self.calls if c[0] == name]

    @property
    def sink(self) -> StandInSink:
        return StandInSink(self.calls)

    async def interrupt(self) -> None:
        self.calls.append(("interrupt",))
        self.responding = False

    async def commit_turn(self, item_id: str, begin_ms: int, end_ms: int) -> ConversationItem:
        self.calls.append(("commit_turn", item_id, begin_ms, end_ms))
        return ConversationItem(id=item_id, role="user", has_audio=True)

    async def respond(self, prefetched: Prefetch | None = None) -> None:
        self.calls.append(("respond", prefetched))
        self.responded.set()
        if prefetched is not None and not self.keep_prefetched:
            await prefetched.discard()

    def transcribe(self, item_id: str, begin_ms: int, end_ms: int) -> None:
        self.calls.append(("transcribe", item_id, begin_ms, end_ms))

    async def store_transcript(self, item_id: str, heard: Heard) -> None:
        self.calls.append(("store_transcript", item_id, heard.words))

    async def request_ahead(
        self, item_id: str, span_ms: tuple[int, int], words: str
    ) -> PipelineRequest:
        self.calls.append(("request_ahead", item_id, span_ms, words))
        return PipelineRequest(request_id="ahead", audio=np.zeros(0, np.int16))


class TinyPipeline:
    """Recognises every audio as `words` (None: it cannot), and judges them `verdict` when
    asked."""

    name = "tiny"

    def __init__(
        self, words: str | None = None, verdict: str | None = None, draft: str | None = None
    ) -> None:
        self.words, self.verdict, self.draft = words, verdict, draft
        self.judging: asyncio.Event | None = None
        """Set: the verdict waits for it (a judge still working when the words are out)."""
        self.finalising: asyncio.Event | None = None
        """Set: the final words after a draft wait for it (a slower recogniser)."""

    async def generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]:
        words = self.words
        if request.transcribe_only and words is None:
            yield ErrorChunk("no recogniser here")
            return
        if request.transcribe_only and request.draft_transcript and self.draft is not None:
            yield TextDelta(self.draft, kind="draft_transcript")  # its verdict: the words'
            if request.judge_turn_end and self.verdict is not None:
                yield TextDelta(self.verdict, kind="turn_end")
            if self.finalising is not None:
                await self.finalising.wait()
        if request.transcribe_only and words is not None:
            yield TextDelta(words, kind="input_transcript")
            if request.judge_turn_end and self.verdict is not None:
                if self.judging is not None:
                    await self.judging.wait()
                yield TextDelta(self.verdict, kind="turn_end")
        yield End()

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def active_requests(self) -> int:
        return 0

    async def forget_session(self, session_id: str) -> None:
        return None

    def capacity(self) -> PipelineCapacity | None:
        return None


class Rig:
    """A turn-taking with its parts: the host, the turns, the state machine."""

    def __init__(
        self, config: dict[str, Any] | None, *, duplex: bool = False, pipeline: TinyPipeline
    ) -> None:
        self.host = StandInHost()
        self.turns = Turns()
        self.heard_pcm = bytearray()
        """Every frame heard, from the input timeline's start: what `read_audio` reads."""
        self.transitions: list[tuple[SessionState, str]] = []
        self.machine = StateMachine("s", lambda old, new, why: self.transitions.append((new, why)))
        td = TurnDetectionConfig.model_validate(config) if config is not None else None
        lock = asyncio.Lock()
        self.tt: TurnTaking
        if duplex:
            self.tt = ModelTurnTaking(self.host, self.turns, self.machine, td, lock)
        else:
            self.tt = ServerTurnTaking(
                self.host,
                self.turns,
                self.machine,
                td,
                lock,
                pipeline=pipeline,
                read_audio=self.read_audio,
                clock=ScaledClock(50.0),
                metrics=SessionMetrics(),
            )

    async def read_audio(self, begin_ms: int, end_ms: int) -> npt.NDArray[np.int16]:
        """The input audio [begin_ms, end_ms) as heard (zeros past what was heard)."""
        heard = np.frombuffer(bytes(self.heard_pcm[begin_ms * 32 : end_ms * 32]), np.int16)
        out = np.zeros((end_ms - begin_ms) * 16, dtype=np.int16)
        out[: len(heard)] = heard
        return out

    async def hear(self, pcm: npt.NDArray[np.int16]) -> None:
        """`pcm` in 20 ms frames, as the session passes them on (under its media lock)."""
        frames = [pcm[i : i + FRAME].tobytes() for i in range(0, len(pcm) - FRAME + 1, FRAME)]
        first = self.turns.received(20 * len(frames))
        self.heard_pcm[first * 32 :] = b"".join(frames)
        await self.tt.hear(frames, first)

    async def silence_until_stopped(self, limit_ms: int = 3000) -> int:
        """Silence, 20 ms at a time, until the turn ends; how much of it passed. The words
        at a pause are known before the next frame: the tiny pipeline answers without
        waiting, so the transcription begun at the pause runs to its end in the one turn
        of the event loop that `sleep(0)` gives it."""
        for waited in range(0, limit_ms, 20):
            if self.host.of(SpeechStopped):
                return waited
            await self.hear(silence(20))
            await asyncio.sleep(0)
        raise AssertionError("the turn never ended")

    async def close(self) -> None:
        await self.tt.close()


def speech(*texts: str, gap_ms: int = 0) -> npt.NDArray[np.int16]:
    pcm, _ = utterances_with_gaps(list(texts), gap_ms=gap_ms, lead_ms=300)
    return pcm


@pytest.fixture
async def rigs() -> AsyncGenerator[list[Rig], None]:
    made: list[Rig] = []
    yield made
    for rig in made:
        await rig.close()


def rig(
    rigs: list[Rig],
    config: dict[str, Any] | None,
    *,
    duplex: bool = False,
    words: str | None = None,
    verdict: str | None = None,
) -> Rig:
    made = Rig(config, duplex=duplex, pipeline=TinyPipeline(words, verdict))
    rigs.append(made)
    return made


async def test_a_spoken_turn_is_committed_from_its_padding_and_answered(rigs: list[Rig]) -> None:
    r = rig(rigs, {"type": "server_vad"}, words="hello there")
    await r.hear(speech("Hello there."))
    assert r.machine.state is SessionState.USER_SPEAKING
    (started,) = r.host.of(SpeechStarted)
    await r.silence_until_stopped()
    (stopped,) = r.host.of(SpeechStopped)
    assert stopped.item_id == started.item_id
    ((item_id, begin, end),) = r.host.called("commit_turn")
    assert item_id == started.item_id
    assert begin == started.audio_start_ms - 300  # the prefix padding
    assert end == r.turns.offset_ms > stopped.audio_end_ms
    # The words at the pause were final at the end, and the answer begun there is adopted.
    assert r.host.called("store_transcript") == [(item_id, "hello there")]
    ((prefetched,),) = r.host.called("respond")
    assert isinstance(prefetched, Prefetch) and prefetched.item_id == item_id


async def test_without_create_response_the_turn_is_transcribed_and_left(rigs: list[Rig]) -> None:
    r = rig(rigs, {"type": "server_vad", "create_response": False})  # no words at a pause
    await r.hear(speech("Hello there."))
    await r.silence_until_stopped()
    ((item_id, begin, end),) = r.host.called("commit_turn")
    assert r.host.called("transcribe") == [(item_id, begin, end)]
    assert not r.host.called("respond") and not r.host.called("request_ahead")
    assert r.machine.state is SessionState.LISTENING
    assert r.transitions[-1] == (SessionState.LISTENING, "turn committed")


async def test_speech_over_an_answer_pauses_it_then_barges_in(rigs: list[Rig]) -> None:
    r = rig(rigs, {"type": "server_vad", "min_speech_ms": 200})
    r.machine.to(SessionState.THINKING, "response started")
    r.machine.to(SessionState.SPEAKING, "first audio")
    r.host.responding = True
    await r.hear(speech("Stop, please wait a moment."))
    assert r.host.called("pause_output") == [()]  # silent at once...
    assert r.host.called("interrupt") == [()]  # ...cut once it lasted min_speech_ms


async def test_noise_over_an_answer_does_not_interrupt_it(rigs: list[Rig]) -> None:
    r = rig(rigs, {"type": "server_vad", "min_speech_ms": 2000})
    r.machine.to(SessionState.THINKING, "response started")
    r.host.responding = True
    await r.hear(speech("Hm."))
    await r.silence_until_stopped()
    assert r.host.called("pause_output") == [()]
    assert not r.host.called("interrupt") and not r.host.called("commit_turn")
    assert r.host.called("resume_output") == [()]  # too short: noise, the answer plays on
    assert r.machine.state is SessionState.THINKING


async def test_manual_commit_and_clear(rigs: list[Rig]) -> None:
    r = rig(rigs, None)  # turn_detection null: the client takes the turns
    await r.hear(speech("Hello there."))
    assert not r.host.of(SpeechStarted)  # nothing is detected
    r.turns.uncommitted_from_ms = r.turns.offset_ms - 60
    with pytest.raises(InvalidRequestError):
        await r.tt.commit()  # 60 ms is too little to commit
    r.turns.uncommitted_from_ms = 0
    item = await r.tt.commit()
    assert r.host.called("commit_turn") == [(item.id, 0, r.turns.offset_ms)]
    assert r.host.called("transcribe") == [(item.id, 0, r.turns.offset_ms)]
    await r.hear(silence(200))
    await r.tt.clear()
    assert r.turns.uncommitted_ms == 0 and r.host.of(AudioBufferCleared)


async def test_a_silence_after_an_answer_becomes_a_turn(rigs: list[Rig]) -> None:
    r = rig(rigs, {"type": "server_vad", "idle_timeout_ms": 5000})  # 100 ms at 50x
    await r.hear(silence(400))
    r.tt.answered()
    await r.hear(silence(200))
    async with asyncio.timeout(5):
        await r.host.responded.wait()
    (timeout,) = r.host.of(InputAudioTimeoutTriggered)
    assert (timeout.audio_start_ms, timeout.audio_end_ms) == (400, 600)
    assert r.host.called("commit_turn") == [(timeout.item_id, 400, 600)]
    assert r.host.called("respond") == [(None,)]


async def test_speech_disarms_the_idle_timeout(rigs: list[Rig]) -> None:
    r = rig(rigs, {"type": "server_vad", "idle_timeout_ms": 5000, "create_response": False})
    r.tt.answered()
    await r.hear(speech("Hello there."))
    await asyncio.sleep(0.3)  # three times the (compressed) timeout: nothing may fire
    assert not r.host.of(InputAudioTimeoutTriggered)


@pytest.mark.parametrize(
    ("words", "verdict", "sooner"),
    [
        ("what is the capital of france", None, True),  # sounds finished: ends at once
        ("what is the capital of the", None, False),  # broken off: waited out longer
        ("set a timer", "unfinished", False),  # the pipeline's verdict outranks the rule
    ],
)
async def test_semantic_vad_ends_a_turn_by_its_words(
    rigs: list[Rig], words: str, verdict: str | None, sooner: bool
) -> None:
    vad = {"type": "semantic_vad", "eagerness": "medium", "create_response": False}
    r = rig(rigs, vad, words=words, verdict=verdict)
    await r.hear(speech("What is the capital of France?"))
    waited = await r.silence_until_stopped()
    # medium waits 700 ms on silence alone; finished words end the turn sooner
    assert (waited < 700) if sooner else (waited > 700), waited


async def test_the_answer_starts_on_the_words_while_their_verdict_is_on_its_way(
    rigs: list[Rig],
) -> None:
    """semantic_vad: the answer begun at a pause does not wait for the judge, so the two run
    side by side; the turn still ends only on the verdict, and adopts that answer."""
    vad = {"type": "semantic_vad", "eagerness": "medium"}
    pipeline = TinyPipeline("what is the capital of france", "finished")
    pipeline.judging = asyncio.Event()
    r = Rig(vad, pipeline=pipeline)
    rigs.append(r)
    await r.hear(speech("What is the capital of France?"))
    for _ in range(10):  # past the pause (60 ms): its words are out, the verdict is not
        await r.hear(silence(20))
        await asyncio.sleep(0)
    (ahead,) = r.host.called("request_ahead")
    assert ahead[2] == "what is the capital of france"
    assert not r.host.of(SpeechStopped)
    pipeline.judging.set()
    waited = await r.silence_until_stopped()
    assert waited < 700, waited  # finished: sooner than medium's silence window
    (answered,) = r.host.called("respond")
    assert answered[0] is not None  # the answer begun on the words, adopted


async def test_speech_going_on_after_a_pause_drops_the_answer_begun_on_it(
    rigs: list[Rig],
) -> None:
    """The answer begun on a pause's words is dropped as soon as the voice comes back, not
    at the next pause: until then it would take the CPU that recognising that pause needs."""
    vad = {"type": "semantic_vad", "eagerness": "medium"}
    r = rig(rigs, vad, words="what is the capital", verdict="unfinished")
    pcm, edges = utterances_with_gaps(["What is the capital", "France"], gap_ms=300, lead_ms=300)
    first_end = edges[0][1] * 16
    await r.hear(pcm[: first_end + 200 * 16])  # the first phrase and 200 ms of its pause
    async with asyncio.timeout(5):
        while not r.host.called("request_ahead"):  # the answer begun on its words
            await asyncio.sleep(0.01)
    outcomes = r.tt._ahead._outcomes  # type: ignore[attr-defined]
    discarded = outcomes.labels("discarded")._value.get()
    second_start = edges[1][0] * 16
    await r.hear(pcm[first_end + 200 * 16 : second_start + 100 * 16])  # the voice is back
    assert outcomes.labels("discarded")._value.get() == discarded + 1
    assert len(r.host.called("request_ahead")) == 1  # no new pause yet


def outcomes(r: Rig) -> dict[str, float]:
    counter = r.tt._ahead._outcomes  # type: ignore[attr-defined]
    return {k: counter.labels(k)._value.get() for k in ("kept", "discarded", "redone")}


@pytest.mark.parametrize(
    ("draft", "begun"),
    [
        ("what is the capital of france", ["what is the capital of france"]),
        (
            "what is the capital of franz",
            ["what is the capital of franz", "What is the capital of France?"],
        ),
    ],
)
async def test_the_answer_starts_on_a_quick_draft_and_again_only_on_other_final_words(
    rigs: list[Rig], draft: str, begun: list[str]
) -> None:
    """A draft of the words that the final words agree with (case and punctuation aside)
    keeps the answer begun on it; other final words begin it again on them."""
    pipeline = TinyPipeline("What is the capital of France?", draft=draft)
    r = Rig({"type": "server_vad"}, pipeline=pipeline)
    rigs.append(r)
    await r.hear(speech("What is the capital of France?"))
    await r.silence_until_stopped()
    # (the answer dropped for other words may not have built its request yet)
    assert r.host.called("request_ahead")[-1][-1] == begun[-1]
    ((prefetched,),) = r.host.called("respond")
    assert isinstance(prefetched, Prefetch) and prefetched.words == begun[-1]
    assert outcomes(r)["discarded"] == len(begun) - 1


async def test_an_answer_on_a_draft_is_redone_when_the_final_words_come_after_the_turns_end(
    rigs: list[Rig],
) -> None:
    """semantic_vad ends the turn on the draft's verdict; the final words come later and
    say otherwise: the answer begun on the draft is not adopted, and they are the turn's."""
    pipeline = TinyPipeline("What is the capital of France?", "finished", "what is the capital")
    pipeline.finalising = asyncio.Event()
    r = Rig({"type": "semantic_vad", "eagerness": "medium"}, pipeline=pipeline)
    r.host.keep_prefetched = True
    rigs.append(r)
    await r.hear(speech("What is the capital of France?"))
    waited = await r.silence_until_stopped()
    assert waited < 700, waited  # on the draft's verdict, before any final words
    ((prefetched,),) = r.host.called("respond")
    assert isinstance(prefetched, Prefetch) and prefetched.words == "what is the capital"
    adopting = asyncio.create_task(r.tt.adopt(prefetched))
    await asyncio.sleep(0.05)
    assert not adopting.done()  # the final words are awaited before the answer is heard
    pipeline.finalising.set()
    heard, adopted = await adopting
    assert heard is not None and heard.words == "What is the capital of France?"
    assert adopted is None and outcomes(r)["redone"] == 1


async def test_a_duplex_model_takes_the_turns(rigs: list[Rig]) -> None:
    """The model decides: speech only becomes items; nothing is answered or interrupted."""
    r = rig(rigs, {"type": "server_vad"}, duplex=True)
    r.machine.to(SessionState.THINKING, "response started")
    r.host.responding = True
    await r.hear(speech("Hello there, how are you?"))
    await r.silence_until_stopped()
    (started,) = r.host.of(SpeechStarted)
    ((item_id, _, _),) = r.host.called("commit_turn")
    assert item_id == started.item_id
    assert not r.host.called("respond") and not r.host.called("interrupt")
    assert not r.host.called("pause_output")
    assert r.machine.state is SessionState.THINKING  # no state changes
    r.tt.answered()  # no idle timer: the model decides when to speak


async def test_no_detector_at_all(rigs: list[Rig]) -> None:
    r = rig(rigs, None, duplex=True)
    await r.hear(speech("Hello there."))
    assert r.tt.detector is None and not r.host.events and not r.host.calls
