"""Adaptive barge-in: the speech over an answer is judged before the answer is cut.

With `turn_detection.interruption: "adaptive"`, speech that starts over an answer pauses
its audio at once, as always (nothing more is played; the playout keeps what is queued and
its cursor stays). Then, instead of cutting the answer once the speech has lasted
`min_speech_ms`, turn-taking (turn_taking.py) opens an `OverlapJudgement`, which gathers
what the session already has and asks the judge (overlap_judge.py) at each step:

* every input frame: how long the voice has lasted (the detector's), and whether the
  deadline has passed: `interruption_deadline_ms` of input audio from the speech's first
  voiced frame with no verdict counts as a real interruption (input audio, like every
  time in turn detection: a client streams it in real time, and tests can feed it faster);
* a pause (the detector reports one after 80 ms of silence while judging): the words,
  none if Silero VAD hears under `NOISE_SPEECH_MS` of speech in 240 ms or more of it (a
  noise), else
  recognised on the speech's audio so far by a transcription-only pipeline request (the
  one the turn's own pause transcript uses, transcription.py), in a task of its own; the
  voice coming back makes that recognition moot;
* the end of the speech (the silence window) before a verdict: remembered, so that a real
  interruption still becomes the user's turn.

The first verdict is handed to turn-taking (`settle`), which applies it: `keep` resumes the
answer where it was held (no audio lost, no truncation, no event but the speech_started /
speech_stopped pair a client already had); `interrupt` cuts it as `always` does. A verdict
reached inside turn-taking's own calls is returned to it; one reached by the recognition
task is settled under the session's media lock, as every change to the turns is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pipeline.tasks import TaskSet, cancel_and_wait
from pipeline.types import Pipeline

from .config import TurnDetectionConfig
from .overlap_judge import Overlap, OverlapJudge, Verdict
from .silero_vad import speech_ms
from .transcription import recognise
from .turn_transcript import AudioReader
from .voice_level import VoiceLevels

log = logging.getLogger("parley.sessions.overlap")

NOISE_SPEECH_MS = 96
"""Speech over an answer in which Silero hears less than this (three 32 ms windows) is a
noise: it is not recognised (Whisper writes "you" or "Thank you." for a cough or a
clatter) and the answer goes on. "Yeah." is ~320 ms of speech to Silero, "Stop." ~320."""
JUDGED_BY_SILERO_MS = 240
"""...if it is at least this long: Silero hears 0-64 ms of speech in the first 120-160 ms of
"Stop." cut at its plosive (its network warms up over a few windows), 96-192 in 200 ms."""


@dataclass(frozen=True, slots=True)
class EndedSpeech:
    """Speech over an answer that ended (the silence window passed) before its verdict."""

    item_id: str
    start_ms: int
    end_ms: int


class OverlapJudgement:
    """The judgement of the speech over an answer; one at a time, begun again for the next.

    `settle(verdict)` is awaited, under `lock`, with a verdict the recognition brings;
    turn-taking applies the others itself (those returned by `heard` and `paused`)."""

    def __init__(
        self,
        name: str,
        judge: OverlapJudge,
        pipeline: Pipeline,
        read_audio: AudioReader,
        lock: asyncio.Lock,
        settle: Callable[[Verdict], Awaitable[None]],
        levels: VoiceLevels | None = None,
    ) -> None:
        self._name = name
        self._levels = levels
        """The speech's level against the user's (turn-taking feeds it every frame)."""
        self._judge = judge
        self._pipeline = pipeline
        self._read_audio = read_audio
        self._lock = lock
        self._settle = settle
        self._tasks = TaskSet(f"{name}:overlap")
        """Owns the recognition in progress (and one being cancelled); `close()` closes it."""
        self._recognition: asyncio.Task[None] | None = None
        self._generation = 0
        """Bumped when a judgement begins or ends: a recognition of an older one is moot."""
        self.active = False
        self._from_ms = 0
        self._deadline_ms = 0
        self._min_speech_ms = 0
        self._voiced_ms = 0
        self._stopped = False
        self._words: str | None = None
        self.ended: EndedSpeech | None = None
        self.past_deadline = False
        """The last verdict was the deadline's."""

    def begin(self, from_ms: int, config: TurnDetectionConfig) -> None:
        """Speech over an answer started (or came back) at `from_ms` on the input timeline:
        a judgement opens, with its deadline counted from there."""
        self._generation += 1
        self.active = True
        self._from_ms = from_ms
        self._deadline_ms = from_ms + config.interruption_deadline_ms
        self._min_speech_ms = config.min_speech_ms
        self._voiced_ms = 0
        self._stopped = False
        self._words = None
        self.ended = None
        self.past_deadline = False

    def heard(self, end_ms: int, speech_end_ms: int | None) -> Verdict | None:
        """Input audio up to `end_ms` was heard, the speech's last voiced frame ending at
        `speech_end_ms` (None: the speech has ended). The deadline's verdict, the judge's,
        or None."""
        if speech_end_ms is not None:
            self._voiced_ms = max(0, speech_end_ms - self._from_ms)
        if end_ms >= self._deadline_ms:
            if self._verdict() is Verdict.KEEP:  # a voice across the room: no words needed
                return Verdict.KEEP
            self.past_deadline = True
            return Verdict.INTERRUPT
        return self._verdict()

    async def paused(self, begin_ms: int, end_ms: int) -> Verdict | None:
        """The voice paused at `end_ms`: the judge's verdict if the words are not needed
        for one, else None and the speech's audio [begin_ms, end_ms) (all of it, from before
        a first backchannel too) is recognised."""
        self._stopped, self._voiced_ms = True, max(0, end_ms - self._from_ms)
        verdict = self._verdict()
        if verdict is None:
            await self._drop_recognition()
            if not self._tasks.closed:
                self._recognition = self._tasks.create_task(
                    self._recognise(self._generation, begin_ms, end_ms), name=self._tasks.name
                )
        return verdict

    async def resumed(self) -> None:
        """The voice came back: the words recognised up to the pause are moot."""
        self._stopped, self._words = False, None
        await self._drop_recognition()

    def speech_ended(self, ended: EndedSpeech) -> None:
        """The speech ended before its verdict (which still comes: the words, the deadline)."""
        self._stopped, self.ended = True, ended

    async def finish(self) -> EndedSpeech | None:
        """The judgement is over (its verdict is being applied, or it is dropped): what it
        was still doing stops. The speech that ended before the verdict, if it did."""
        self._generation += 1
        self.active = False
        ended, self.ended = self.ended, None
        await self._drop_recognition()
        return ended

    async def close(self) -> None:
        """Cancel and await the recognition, if any. Idempotent."""
        self.active = False
        self._recognition = None
        await self._tasks.close()

    def _verdict(self) -> Verdict | None:
        level = self._levels.against_user_db() if self._levels is not None else None
        return self._judge.judge(
            Overlap(self._voiced_ms, self._stopped, self._words, self._min_speech_ms, level)
        )

    async def _drop_recognition(self) -> None:
        task, self._recognition = self._recognition, None
        if task is not None and task is not asyncio.current_task():
            await cancel_and_wait(task)

    async def _recognise(self, generation: int, begin_ms: int, end_ms: int) -> None:
        """The words of [begin_ms, end_ms), judged; a verdict is settled under the lock. A
        failed recognition brings none (the deadline decides)."""
        try:
            pcm = await self._read_audio(begin_ms, end_ms)
            if len(pcm) >= JUDGED_BY_SILERO_MS * 16 and (
                await asyncio.to_thread(speech_ms, pcm) < NOISE_SPEECH_MS
            ):
                words = ""  # Silero hears (almost) no speech in it: a noise, whatever Whisper says
            else:
                words = (await recognise(self._pipeline, pcm)).words
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("session %s: recognising speech over an answer failed: %r", self._name, exc)
            return
        async with self._lock:
            if generation != self._generation or not self.active:
                return  # the voice came back, or a verdict came first
            self._recognition = None  # settling finishes the judgement: not this task
            self._words = words
            verdict = self._verdict()
            if verdict is not None:
                await self._settle(verdict)
