"""Turn-taking: when the user's turn starts and ends, and when the assistant yields.

A session holds one `TurnTaking`. It is chosen when the session starts, by who decides
the turns:

* `ServerTurnTaking`: Parley decides (a turn-based pipeline). With `turn_detection` set,
  the detector (turn_detection.py) hears the input audio; speech interrupts an answer,
  the end of speech commits the turn and answers it, words recognised at a pause let
  semantic_vad end the turn sooner or later and let the answer begin ahead (prefetch.py),
  and a silence after an answer can become a turn (`idle_timeout_ms`, idle_timer.py).
  For a pipeline that takes a turn while the user speaks, the speech that becomes the
  user's turn is streamed to it from its start (streamed_turn.py) and its answer names it;
  speech dropped (cleared, committed by hand, noise) drops it. Manual turns are not streamed.
  With `turn_detection` null the client decides: nothing is detected, and only
  `commit()` and `clear()` move the turns (OpenAI's manual mode).
* `ModelTurnTaking`: a full-duplex model decides (duplex_turns.py), so Parley's turn-taking
  stands aside: no answer is started, interrupted or prompted by silence here, and no
  state changes. The detector, if `turn_detection` is set, only tells where the user
  spoke, so that speech becomes items of the conversation (speech_started/stopped, a
  committed item); with `turn_detection` null the session runs with no detector at all.

What turn-taking is told (its methods, all called by the session; the media ones under
the session's media lock, which turn-taking takes itself only for the idle timeout):
`hear(frames, first_ms)` (input audio), `commit()` and `clear()` (the client's manual
turn), `reconfigure(config)` (a session.update), `answering()` and `answered()` (an
answer starts; one has played out), `words(item_id)` (the words recognised at the pause
where a turn ended, for its answer), `drop_ahead()` (an answer to something else
starts: the one begun ahead is moot) and `close()` (cancels and awaits its tasks).

What it reads and drives of the session: two plain parts given at construction, the
`Turns` bookkeeping (where each turn's audio lies) and the `StateMachine` (it makes the
listening / user_speaking transitions), and a `TurnHost` (turn_host.py): what the session does
for it. It knows no transport, no Redis and no response: a test drives it with a stand-in
host, a `Turns`, a `StateMachine` and a tiny pipeline (tests/sessions/test_turn_taking.py).
"""

from __future__ import annotations

import asyncio

from pipeline.audio_format import FRAME_MS
from pipeline.types import Pipeline

from .clock import Clock
from .config import TurnDetectionConfig
from .errors import InvalidRequestError
from .events import (
    AudioBufferCleared,
    ConversationItem,
    InputAudioTimeoutTriggered,
    SpeechStarted,
    SpeechStopped,
    new_id,
)
from .idle_timer import IdleTimer
from .metrics import SessionMetrics
from .overlap import EndedSpeech, OverlapJudgement
from .overlap_judge import BackchannelRules, Verdict
from .prefetch import Prefetch, PrefetchSlot
from .state import SessionState, StateMachine
from .streamed_turn import TurnContext, TurnStream
from .transcription import Heard
from .turn_detection import (
    OVERLAP_PAUSE_MS,
    PAUSE_MS,
    SpeechConfirmed,
    SpeechEnd,
    SpeechPause,
    SpeechResumed,
    SpeechStart,
    TurnDetector,
    TurnSignal,
)
from .turn_end import sounds_finished
from .turn_host import TurnHost
from .turn_transcript import AudioReader, TurnTranscript
from .turns import MIN_COMMIT_MS, Turns
from .voice_level import VoiceLevels

_S = SessionState


class TurnTaking:
    """What every turn-taking does: the detector (or none), the client's manual commit and
    clear, and a new configuration. Subclasses say what the detector's signals mean."""

    def __init__(
        self,
        host: TurnHost,
        turns: Turns,
        machine: StateMachine,
        config: TurnDetectionConfig | None,
        media_lock: asyncio.Lock,
    ) -> None:
        self._host = host
        self._turns = turns
        self._machine = machine
        self._lock = media_lock
        self.config = config
        self.detector = TurnDetector(config) if config is not None else None
        self._heard_to_ms = 0
        """Input audio before this has been heard (every frame's signals handled, or the
        frame being heard now begins here)."""

    async def hear(self, frames: list[bytes], first_ms: int) -> None:
        """Input audio: 20 ms frames starting at `first_ms` on the input timeline."""
        for i, frame in enumerate(frames):
            if self.detector is None:
                return
            offset_ms = first_ms + i * FRAME_MS
            self._heard_to_ms = offset_ms
            self.detector.pause_ms = self._pause_ms()
            for signal in self.detector.process(frame, offset_ms):
                await self._on_signal(signal)
            self._frame_passed(frame, offset_ms)
            self._heard_to_ms = offset_ms + FRAME_MS
            await self._frame_heard(offset_ms + FRAME_MS)

    def _pause_ms(self) -> int:
        """The silence reported as a pause now (turn_detection.PAUSE_MS)."""
        return PAUSE_MS

    def _frame_passed(self, frame: bytes, offset_ms: int) -> None:
        """A frame's signals are handled (the frame itself, for a turn streamed as heard)."""

    async def _on_signal(self, signal: TurnSignal) -> None:
        raise NotImplementedError

    async def _frame_heard(self, end_ms: int) -> None:
        """A frame's signals are handled: input audio up to `end_ms` has been heard."""

    def reconfigure(self, config: TurnDetectionConfig | None) -> None:
        """New `turn_detection` settings from the next frame on (None: the client decides)."""
        if config is None:
            self.detector = None
            self._host.sink.resume()  # no detector left to end a pause it began
        elif self.detector is None:
            self.detector = TurnDetector(config)
        else:
            self.detector.reconfigure(config)
        self.config = config

    async def commit(self) -> ConversationItem:
        """input_audio_buffer.commit: the uncommitted audio becomes a user item."""
        if self._turns.uncommitted_ms < MIN_COMMIT_MS:
            raise InvalidRequestError(
                "Error committing input audio buffer: the buffer holds "
                f"{self._turns.uncommitted_ms} ms of audio; at least {MIN_COMMIT_MS} ms "
                "is needed",
                "input_audio_buffer_commit_empty",
            )
        await self._forget_speech()
        if self._machine.state is _S.USER_SPEAKING:
            self._machine.to(_S.LISTENING, "buffer committed")
        begin, end = self._turns.uncommitted_from_ms, self._turns.offset_ms
        item = await self._host.commit_turn(new_id("item"), begin, end)
        self._host.transcribe(item.id, begin, end)
        return item

    async def clear(self) -> None:
        """input_audio_buffer.clear: the uncommitted audio is dropped."""
        self._turns.cleared()
        await self._forget_speech()
        if self._machine.state is _S.USER_SPEAKING:
            self._machine.to(_S.LISTENING, "buffer cleared")
        self._host.emit(AudioBufferCleared())

    async def _forget_speech(self) -> None:
        if self.detector is not None:
            self.detector.reset()
        self._host.sink.resume()

    def _speech_started(self, start_ms: int) -> None:
        item_id = self._turns.speech_started()
        self._host.emit(SpeechStarted(audio_start_ms=start_ms, item_id=item_id))

    def _speech_begin_ms(self, start_ms: int) -> int:
        padding = self.config.prefix_padding_ms if self.config is not None else 0
        return self._turns.speech_begin_ms(start_ms, padding)

    # --- what the session's answers tell it (no-ops unless Parley takes the turns) ---

    def answering(self) -> None:
        """An answer starts."""

    def answered(self) -> None:
        """An answer has played out."""

    async def words(self, item_id: str) -> Heard | None:
        """The words recognised at the pause where the turn `item_id` ended, if any."""
        return None

    async def adopt(self, taken: Prefetch) -> tuple[Heard | None, Prefetch | None]:
        """The final words of the turn that `taken` answers, and `taken` if it answers them
        (None: it was begun on a draft they overrule, and is discarded)."""
        return None, taken

    async def drop_ahead(self) -> None:
        """An answer to anything else starts: the one begun ahead, if any, is dropped."""

    async def streamed_turn(self, item_id: str | None, *, ahead: bool = False) -> str:
        """The turn of item `item_id` as it was streamed to the pipeline while the user
        spoke, for its answer's request (`PipelineRequest.streamed_turn`), or ""
        (streamed_turn.py). `ahead`: the answer is begun at a pause."""
        return ""

    async def close(self) -> None:
        """Cancel and await whatever it began. Idempotent."""


class ModelTurnTaking(TurnTaking):
    """A full-duplex model takes the turns: the detector only marks where the user spoke."""

    async def _on_signal(self, signal: TurnSignal) -> None:
        """The speech becomes an item of the conversation, and the model alone decides to
        answer or yield (no answer is started, none is interrupted, no state changes)."""
        match signal:
            case SpeechStart(start_ms=start):
                self._speech_started(start)
            case SpeechEnd(start_ms=start, end_ms=end):
                item_id = self._turns.speech_stopped()
                self._host.emit(SpeechStopped(audio_end_ms=end, item_id=item_id))
                begin = self._speech_begin_ms(start)
                await self._host.commit_turn(item_id, begin, self._turns.offset_ms)


class ServerTurnTaking(TurnTaking):
    """Parley takes the turns (server_vad, semantic_vad), or the client does (none)."""

    def __init__(
        self,
        host: TurnHost,
        turns: Turns,
        machine: StateMachine,
        config: TurnDetectionConfig | None,
        media_lock: asyncio.Lock,
        *,
        pipeline: Pipeline,
        read_audio: AudioReader,
        clock: Clock,
        metrics: SessionMetrics,
        turn_context: TurnContext | None = None,
    ) -> None:
        """`pipeline`, `read_audio`: recognise the words at a pause and begin the answer
        ahead; `metrics`: the session's (barge-ins, answers begun ahead); `turn_context`:
        the request a turn would be answered with so far, for a pipeline that takes a turn
        while the user speaks (None: turns are never streamed)."""
        super().__init__(host, turns, machine, config, media_lock)
        self._name = name = machine.session_id
        self._pipeline = pipeline
        self._barge_ins = metrics.barge_ins
        self._idle = IdleTimer(clock, name)
        self.transcript = TurnTranscript(
            name,
            pipeline,
            read_audio,
            host.emit,
            heard=self._pause_heard,
            judge=self._semantic,
            words=self._pause_words,
            draft=self._drafts,
        )
        """The words of the turn in progress, recognised at its pauses."""
        self._ahead = PrefetchSlot(metrics.prefetches)
        """An answer begun at the open turn's last pause."""
        self._levels = VoiceLevels()
        """The speech's level and the user's turns' (a voice across the room is kept)."""
        self._overlap = OverlapJudgement(
            name, BackchannelRules(), pipeline, read_audio, media_lock, self._settle, self._levels
        )
        """`interruption: "adaptive"`: the judgement of the speech over an answer."""
        self._verdicts = metrics.overlap_verdicts
        self._kept_speech: str | None = None
        """The speech (its item id) last judged a backchannel, while it goes on: its voice
        coming back after a pause is judged again (a backchannel followed by more)."""
        self.stream = (
            TurnStream(name, pipeline, read_audio, turn_context)
            if turn_context is not None
            else None
        )
        """The turn in progress, streamed to a pipeline that takes it (streamed_turn.py)."""
        self._speech_start_ms = 0
        """Where the speech heard now began."""

    async def _on_signal(self, signal: TurnSignal) -> None:
        td = self.config
        assert td is not None
        state, host, turns = self._machine.state, self._host, self._turns
        match signal:
            case SpeechStart(start_ms=start):
                self._levels.speech_started()
                self._idle.disarm()
                self._speech_started(start)
                self._speech_start_ms = start
                if state is _S.LISTENING:
                    self._machine.to(_S.USER_SPEAKING, "speech started")
                    self._open_turn()
                elif td.interrupt_response and host.responding:
                    if td.interruption == "adaptive":
                        self._judge_overlap(start)  # silent at once; cut or resumed as judged
                    else:
                        host.sink.pause()  # silent at once; cut when confirmed, resumed if not
            case SpeechConfirmed(start_ms=start):
                if state in (_S.THINKING, _S.SPEAKING) and td.interrupt_response:
                    if td.interruption == "adaptive":
                        if not self._overlap.active:  # it began as the answer did
                            self._judge_overlap(start)
                        return
                    self._barge_ins.inc()
                    await host.interrupt()
                    self._open_turn()
                elif state is _S.LISTENING and turns.speech_item_id is not None:
                    # Speech began over the answer's last moments and the answer ended before
                    # it was long enough to cut: nothing is left to interrupt, and this is
                    # the user's next turn (not noise, which is how its end would be taken).
                    await self._drop_judgement()
                    host.sink.resume()
                    self._machine.to(_S.USER_SPEAKING, "speech started")
                    self._open_turn()
            case SpeechPause(start_ms=start, end_ms=end):
                speech_id = turns.speech_item_id
                if state is _S.USER_SPEAKING and speech_id is not None:
                    begin = self._speech_begin_ms(start)
                    await self.transcript.pause(speech_id, begin, end)
                elif self._overlap.active:
                    begin = self._speech_begin_ms(start)
                    verdict = await self._overlap.paused(begin, end)
                    if verdict is not None:
                        await self._settle(verdict)
            case SpeechResumed(at_ms=at):
                # the turn goes on: an answer begun on the pause's words would only hold the
                # CPU that recognising the next pause needs
                await self.transcript.moot()
                await self._ahead.drop()
                if self.stream is not None:  # an answer begun ahead took the turn with it
                    self.stream.resumed(self._heard_to_ms)
                if self._overlap.active:
                    await self._overlap.resumed()
                elif (
                    self._kept_speech is not None
                    and self._kept_speech == turns.speech_item_id
                    and td.interruption == "adaptive"
                    and td.interrupt_response
                    and host.responding
                ):  # a backchannel followed by more: held again, and judged on all of it
                    self._judge_overlap(at)
            case SpeechEnd(start_ms=start, end_ms=end):
                self._levels.speech_ended()
                self._kept_speech = None
                if self._overlap.active:  # not judged yet: its verdict still decides
                    item_id = turns.speech_stopped()
                    host.emit(SpeechStopped(audio_end_ms=end, item_id=item_id))
                    self._overlap.speech_ended(EndedSpeech(item_id, start, end))
                    return
                await self._speech_ended(td, start, end)

    async def _frame_heard(self, end_ms: int) -> None:
        """While speech over an answer is judged: how long its voice lasts, and its deadline."""
        detector = self.detector
        if not self._overlap.active or detector is None:
            return
        verdict = self._overlap.heard(end_ms, detector.speech_end_ms)
        if verdict is not None:
            await self._settle(verdict)

    def _judge_overlap(self, from_ms: int) -> None:
        """Speech over the answer from `from_ms`: the answer is held (silent, its audio kept)
        while the speech is judged (overlap.py)."""
        assert self.config is not None
        self._host.sink.pause()
        self._kept_speech = None
        self._overlap.begin(from_ms, self.config)

    async def _settle(self, verdict: Verdict) -> None:
        """The speech over the answer is judged (under the media lock): a backchannel or a
        noise resumes the answer where it was held; a real interruption cuts it, as
        `always` does, and if the speech has ended already, it is the user's turn."""
        past_deadline = self._overlap.past_deadline
        ended = await self._drop_judgement()
        self._verdicts.labels("deadline" if past_deadline else verdict.value).inc()
        host, machine = self._host, self._machine
        if self.config is None:  # turn detection was turned off meanwhile: the client decides
            host.sink.resume()
            return
        if verdict is Verdict.KEEP:
            self._kept_speech = self._turns.speech_item_id  # None: it has ended
            host.sink.resume()
            return
        if machine.state in (_S.THINKING, _S.SPEAKING):
            self._barge_ins.inc()
            await host.interrupt()
        else:  # the answer ended meanwhile (cancelled): the speech is the user's turn
            host.sink.resume()
            if machine.state is _S.LISTENING:
                machine.to(_S.USER_SPEAKING, "speech started")
        if ended is None and machine.state is _S.USER_SPEAKING:  # it goes on: the turn
            self._open_turn()
        if ended is not None and self.config is not None:
            await self._answer_turn(self.config, ended.item_id, ended.start_ms, ended.end_ms)

    async def _speech_ended(self, td: TurnDetectionConfig, start_ms: int, end_ms: int) -> None:
        """The user's speech ended at `end_ms`: the turn is committed and answered (or
        transcribed, with `create_response` off); speech too short to interrupt the
        answer it began over was noise."""
        host, turns = self._host, self._turns
        item_id = turns.speech_stopped()
        await self.transcript.ended(item_id, end_ms)
        host.emit(SpeechStopped(audio_end_ms=end_ms, item_id=item_id))
        if self._machine.state is not _S.USER_SPEAKING:
            host.sink.resume()  # too short to interrupt the answer (or judged): noise
            self._drop_turn()
            return
        await self._answer_turn(td, item_id, start_ms, end_ms)

    async def _answer_turn(
        self, td: TurnDetectionConfig, item_id: str, start_ms: int, end_ms: int
    ) -> None:
        """The speech `item_id` [start_ms, end_ms) becomes the user's turn, and is answered."""
        host, turns = self._host, self._turns
        self._levels.user_turn()
        begin = self._speech_begin_ms(start_ms)
        await host.commit_turn(item_id, begin, turns.offset_ms)
        words = self.transcript.ready(item_id)
        if words is not None:  # recognised at the pause: final at speech_stopped
            await host.store_transcript(item_id, words)
        prefetched = await self._ahead.take(item_id, end_ms)
        if prefetched is not None or not td.create_response:
            self._drop_turn()  # answered by the work begun ahead, or not answered now
        if td.create_response:
            await host.respond(prefetched)
        else:
            if words is None:
                host.transcribe(item_id, begin, turns.offset_ms)
            self._machine.to(_S.LISTENING, "turn committed")

    def _semantic(self) -> bool:
        return self.config is not None and self.config.type == "semantic_vad"

    def _drafts(self) -> bool:
        """A quick draft of a pause's words helps where an answer or a verdict waits on them."""
        return self.config is not None and (self.config.create_response or self._semantic())

    async def _pause_heard(self, item_id: str, begin_ms: int, end_ms: int, heard: Heard) -> None:
        """The words up to a pause and their verdict are known: semantic_vad judges them (by
        the pipeline's verdict, or failing one by their last word: turn_end.py)."""
        words = heard.words
        finished = heard.finished if heard.finished is not None else sounds_finished(words)
        if self.detector is not None:
            self.detector.judge_pause(end_ms, finished)

    async def _pause_words(self, item_id: str, begin_ms: int, end_ms: int, words: str) -> None:
        """The words up to a pause are known (their verdict may be on its way): the answer
        to them starts now (prefetch.py), kept if the turn ends at this pause."""
        td = self.config
        if (
            td is None
            or not td.create_response
            or not words
            or self._machine.state is not _S.USER_SPEAKING
            or self._turns.speech_item_id != item_id
        ):
            return
        await self._ahead.start(
            self._pipeline,
            lambda: self._host.request_ahead(item_id, (begin_ms, end_ms), words),
            item_id=item_id,
            end_ms=end_ms,
            words=words,
            name=f"{self._name}:prefetch",
        )

    # --- the turn streamed while the user speaks (streamed_turn.py) ----------------------

    def _open_turn(self) -> None:
        """The speech heard now is the user's turn: streamed from its audio's beginning."""
        speech_id = self._turns.speech_item_id
        if self.stream is not None and speech_id is not None:
            begin = self._speech_begin_ms(self._speech_start_ms)
            self.stream.open(speech_id, begin, self._heard_to_ms)

    def _drop_turn(self) -> None:
        if self.stream is not None:
            self.stream.drop()

    def _frame_passed(self, frame: bytes, offset_ms: int) -> None:
        if self.detector is not None:
            self._levels.frame(self.detector.level_dbfs)
        if self.stream is not None:
            self.stream.heard(frame, offset_ms)

    async def streamed_turn(self, item_id: str | None, *, ahead: bool = False) -> str:
        return await self.stream.take(item_id, ahead=ahead) if self.stream is not None else ""

    def reconfigure(self, config: TurnDetectionConfig | None) -> None:
        super().reconfigure(config)
        if config is None:  # the client decides the turns: none is streamed
            self._drop_turn()

    # --- the idle timeout ---------------------------------------------------------------

    def answering(self) -> None:
        self._idle.disarm()

    def answered(self) -> None:
        """An answer has played out: with `idle_timeout_ms`, silence from now on is timed."""
        td = self.config
        if td is None or td.idle_timeout_ms is None or self._host.closing:
            return
        start_ms = self._turns.offset_ms
        self._idle.arm(td.idle_timeout_ms / 1000, lambda: self._idle_timed_out(start_ms))

    async def _idle_timed_out(self, start_ms: int) -> None:
        """Nobody spoke: the silence since `start_ms` is the user's turn, and is answered."""
        host, turns = self._host, self._turns
        async with self._lock:
            if host.closing or self._machine.state is not _S.LISTENING or host.responding:
                return
            item_id = new_id("item")
            end_ms = turns.offset_ms
            begin_ms = max(start_ms, turns.uncommitted_from_ms)
            host.emit(
                InputAudioTimeoutTriggered(
                    item_id=item_id, audio_start_ms=begin_ms, audio_end_ms=end_ms
                )
            )
            if self.detector is not None:
                self.detector.reset()
            await host.commit_turn(item_id, begin_ms, end_ms)
        await host.respond()

    # --- the work begun at a pause ------------------------------------------------------

    async def words(self, item_id: str) -> Heard | None:
        return await self.transcript.result(item_id)

    async def adopt(self, taken: Prefetch) -> tuple[Heard | None, Prefetch | None]:
        heard = await self.transcript.result(taken.item_id)
        return heard, await self._ahead.settle(taken, None if heard is None else heard.words)

    async def drop_ahead(self) -> None:
        await self._ahead.drop()

    def _pause_ms(self) -> int:
        return OVERLAP_PAUSE_MS if self._overlap.active else PAUSE_MS

    async def _drop_judgement(self) -> EndedSpeech | None:
        """The judgement of the speech over the answer, if any, is over: what it was doing
        stops; the speech that ended before its verdict, if it did."""
        return await self._overlap.finish() if self._overlap.active else None

    async def _forget_speech(self) -> None:
        await super()._forget_speech()
        self._drop_turn()  # cleared, or committed by hand
        self._kept_speech = None
        await self._drop_judgement()  # the speech is gone: nothing left to judge

    async def close(self) -> None:
        await self._idle.close()
        if self.stream is not None:
            await self.stream.close()
        await self.transcript.close()
        await self._overlap.close()
        await self._ahead.drop()
