"""The transcript of the turn in progress, begun at its pauses.

Recognising a turn only once it has ended puts the recogniser's whole run between the end
of speech and the answer. The turn detector reports a pause (`SpeechPause`) a moment after
the voice stops, and most of the silence window is still to come before the turn is known
to have ended. So at each pause this starts a transcription-only pipeline request on the
turn's audio so far; when the turn ends where the pause began, its transcript is ready or
nearly so, and the answer's request carries it (`PipelineRequest.transcript`) instead of
recognising the audio again. Speech that goes on after the pause makes that work moot: the
next pause starts again, on more audio.

The words heard at a mid-turn pause are sent as partial transcripts
(`...input_audio_transcription.delta`) when they extend what was sent before, each with the
tokens of what it adds if the session asked for their log-probabilities. One task at a
time; `close()` cancels and awaits it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial

import numpy as np
import numpy.typing as npt

from pipeline.tasks import TaskSet, cancel_and_wait
from pipeline.types import NO_HINTS, Pipeline, RecognitionHints

from .events import Event, InputTranscriptionDelta
from .transcription import Heard, recognise, tokens_after

log = logging.getLogger("parley.sessions.turn_transcript")

FINAL_WAIT_S = 5.0
"""How long an answer waits for a transcript begun at its turn's pause."""
MAX_KEPT = 4

AudioReader = Callable[[int, int], Awaitable[npt.NDArray[np.int16]]]


class TurnTranscript:
    def __init__(
        self,
        session_id: str,
        pipeline: Pipeline,
        read_audio: AudioReader,
        emit: Callable[[Event], None],
        heard: Callable[[str, int, int, Heard], Awaitable[None]] | None = None,
        judge: Callable[[], bool] = lambda: False,
        words: Callable[[str, int, int, str], Awaitable[None]] | None = None,
        draft: Callable[[], bool] = lambda: False,
    ) -> None:
        """`heard(item_id, begin_ms, end_ms, heard)`: awaited with the words of each pause and
        their verdict (semantic_vad judges them); `words(item_id, begin_ms, end_ms, words)`:
        awaited with the words alone as soon as they come, before any verdict (an answer may
        start on them); `judge()`: whether to ask the pipeline too if the words sound
        finished; `draft()`: whether to ask for a quick draft of the words first (the
        pipeline's, if it has one: `words` and `heard` then hear the draft, then the final
        words of record)."""
        self._judge = judge
        self._draft = draft
        self._words = words
        self.hints: Callable[[], RecognitionHints] = lambda: NO_HINTS
        """The session's language and prompt for recognising, as they are now (the session
        sets it: session.py)."""
        self._session_id = session_id
        self._heard = heard
        self._pipeline = pipeline
        self._read_audio = read_audio
        self._emit = emit
        self._task: asyncio.Task[Heard | None] | None = None
        self._covers: tuple[str, int] | None = None
        """(item id, end_ms) of the audio the task transcribes."""
        self._sent: dict[str, str] = {}
        """Per turn (the latest few), the partial transcript sent so far as deltas: a
        turn's transcript may finish after the next turn's first pause has sent its own."""
        self._kept: dict[str, asyncio.Task[Heard | None]] = {}
        """Transcripts of ended turns, until their answer asks (`result`)."""
        self._tasks = TaskSet(f"{session_id}:turn-asr")
        """Owns every transcription (running, kept, waited for); `close()` closes it."""
        self.kept = 0
        self.discarded = 0

    async def pause(self, item_id: str, begin_ms: int, end_ms: int) -> None:
        """The voice paused: transcribe the turn's audio [begin_ms, end_ms) from now."""
        await self._drop()
        if self._tasks.closed:
            return
        self._covers = (item_id, end_ms)
        self._task = self._tasks.create_task(  # its outcome is read by `ready` or `result`
            self._transcribe(item_id, begin_ms, end_ms), name=self._tasks.name, log_failure=False
        )

    async def ended(self, item_id: str, end_ms: int) -> None:
        """The turn `item_id` ended at `end_ms`: the transcript begun on exactly that audio
        is kept for `result`; one begun on less is dropped."""
        task, covers = self._task, self._covers
        self._task, self._covers = None, None
        if task is None:
            return
        if covers != (item_id, end_ms):
            self.discarded += 1
            await cancel_and_wait(task)
            return
        while len(self._kept) >= MAX_KEPT:  # never asked for: the oldest goes
            _, stale = self._kept.popitem()
            await cancel_and_wait(stale)
        self._kept[item_id] = task

    def ready(self, item_id: str) -> Heard | None:
        """The transcript kept for the turn `item_id` if it is finished already (taken:
        `result` then has none), else None and it stays kept."""
        task = self._kept.get(item_id)
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        del self._kept[item_id]
        heard = task.result()
        self.kept += heard is not None
        return heard

    async def result(self, item_id: str) -> Heard | None:
        """The transcript kept for the turn `item_id` (waiting for it), or None."""
        task = self._kept.pop(item_id, None)
        if task is None:
            return None
        try:
            async with asyncio.timeout(FINAL_WAIT_S):
                heard = await asyncio.shield(task)
        except TimeoutError:
            return None
        finally:
            if not task.done():  # timed out, or the answer was cancelled meanwhile
                await cancel_and_wait(task)
        self.kept += heard is not None
        return heard

    async def moot(self) -> None:
        """Speech went on after the pause: the recognition begun on it is dropped (the
        partial transcript sent so far stands)."""
        await self._drop()

    async def forget(self) -> None:
        """The turn was cut short (cleared, committed by hand): nothing of it is kept."""
        if self._covers is not None:
            self._sent.pop(self._covers[0], None)
        await self._drop()

    async def close(self) -> None:
        """Cancel and await everything in progress. Idempotent."""
        await self._drop()
        self._kept = {}
        await self._tasks.close()  # the kept ones and those an answer waits for

    async def _drop(self) -> None:
        task, self._task, self._covers = self._task, None, None
        if task is not None:
            self.discarded += 1
            await cancel_and_wait(task)

    async def _transcribe(self, item_id: str, begin_ms: int, end_ms: int) -> Heard | None:
        try:
            pcm = await self._read_audio(begin_ms, end_ms)
            on_words = (
                None if self._words is None else partial(self._words, item_id, begin_ms, end_ms)
            )
            on_draft = (
                None if self._heard is None else partial(self._heard, item_id, begin_ms, end_ms)
            )
            heard = await recognise(
                self._pipeline,
                pcm,
                judge_turn_end=self._judge(),
                on_words=on_words,
                draft=self._draft(),
                on_draft=on_draft,
                hints=self.hints(),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the turn's end recognises the audio the usual way
            log.warning("session %s: transcript at a pause failed: %r", self._session_id, exc)
            return None
        text = heard.words
        if self._heard is not None:
            await self._heard(item_id, begin_ms, end_ms, heard)
        sent = self._sent.pop(item_id, "")
        if text.startswith(sent) and len(text) > len(sent):
            tokens = tokens_after(heard.logprobs, sent)
            delta = InputTranscriptionDelta(
                item_id=item_id, delta=text[len(sent) :], logprobs=tokens
            )
            self._emit(delta)
            sent = text
        self._sent[item_id] = sent  # the latest turn last
        while len(self._sent) > MAX_KEPT + 1:
            del self._sent[next(iter(self._sent))]
        return heard
