"""Transcripts of user audio items that no answer is transcribing.

The pipeline's recogniser transcribes a turn as part of answering it. A committed turn that
no answer follows at once (turn detection with `create_response: false`, a manual commit,
an `input_audio` item) still gets its transcript, as OpenAI's do: the session asks the
pipeline for a transcription-only request (`PipelineRequest.transcribe_only`), one item at
a time, and sends `...input_audio_transcription.delta`, then `.completed` (or `.failed`),
and stores the words on the item. If an answer starts on the item first, the answer
transcribes it and the queued request is dropped; if the transcript came first, the answer
does not announce it again.

The queue is bounded (`MAX_PENDING`; past it the oldest waiting item goes untranscribed, and
is counted), and its one task is run by the session's task group.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.types import (
    NO_HINTS,
    End,
    ErrorChunk,
    Logprobs,
    Pipeline,
    PipelineRequest,
    RecognitionHints,
    TextDelta,
)
from pipeline.word_match import same_words

from .events import (
    Event,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    new_id,
)
from .history import History

log = logging.getLogger("parley.sessions.transcription")

MAX_PENDING = 16
TRANSCRIBE_TIMEOUT_S = 30.0


class TranscriptionFailed(Exception):
    """The pipeline's recogniser reported an error for the audio."""


@dataclass(frozen=True, slots=True)
class Heard:
    words: str
    finished: bool | None = None
    """Whether the words sound like a whole turn, if asked and the pipeline could judge."""
    logprobs: Logprobs | None = None
    """The words' tokens with their log-probabilities, if the session asked for them
    (`RecognitionHints.logprobs`) and the recogniser has them."""


def tokens_after(logprobs: Logprobs | None, sent: str) -> Logprobs | None:
    """The tokens of what a transcript adds to `sent`, the part of it sent before: those
    that end past it (a token that straddles the two goes with the part that completes it)."""
    if logprobs is None:
        return None
    before, end = len(sent.encode("utf-8")), 0
    for index, token in enumerate(logprobs):
        end += len(token.utf8)
        if end > before:
            return logprobs[index:]
    return ()


async def recognise(
    pipeline: Pipeline,
    pcm: npt.NDArray[np.int16],
    *,
    judge_turn_end: bool = False,
    on_words: Callable[[str], Awaitable[None]] | None = None,
    draft: bool = False,
    on_draft: Callable[[Heard], Awaitable[None]] | None = None,
    hints: RecognitionHints = NO_HINTS,
) -> Heard:
    """The words of `pcm`, from a transcription-only pipeline request (one place for both
    transcribers here and in turn_transcript.py), with the pipeline's verdict on whether they
    end the turn if `judge_turn_end`; `on_words` is awaited with the words as soon as they
    come, before the verdict; `hints`: the client's language and prompt. Raises
    TranscriptionFailed or TimeoutError.

    With `draft`, the pipeline is asked for a draft first (`draft_transcript`): if it has a
    quicker recogniser, its words go to `on_words` as soon as they come, and with their
    verdict (if judged) to `on_draft`; then the final words to `on_words` again. The result is
    the final words, with the draft's verdict when they are the same words."""
    request = PipelineRequest(
        request_id=new_id("tr"),
        audio=pcm,
        session_id="",
        transcribe_only=True,
        judge_turn_end=judge_turn_end,
        draft_transcript=draft,
        recognition=hints,
    )
    parts: list[str] = []
    drafted: Heard | None = None
    finished: bool | None = None
    logprobs: Logprobs | None = None
    stream = pipeline.generate(request)
    async with aclosing(stream), asyncio.timeout(TRANSCRIBE_TIMEOUT_S):
        async for chunk in stream:
            match chunk:
                case TextDelta(kind="draft_transcript"):
                    drafted = Heard(chunk.text.strip())
                    if on_words is not None and drafted.words:
                        await on_words(drafted.words)
                case TextDelta(kind="input_transcript"):
                    parts.append(chunk.text)
                    if chunk.logprobs is not None:
                        logprobs = (*(logprobs or ()), *chunk.logprobs)
                    if on_words is not None and (words := "".join(parts).strip()):
                        await on_words(words)
                case TextDelta(kind="turn_end") if drafted is not None and not parts:
                    drafted = Heard(drafted.words, chunk.text == "finished")
                    if on_draft is not None:
                        await on_draft(drafted)
                case TextDelta(kind="turn_end"):
                    finished = chunk.text == "finished"
                case ErrorChunk():
                    raise TranscriptionFailed(chunk.message)
                case End():
                    break
    words = "".join(parts).strip()
    if finished is None and drafted is not None and same_words(drafted.words, words):
        finished = drafted.finished  # the same words: the draft's verdict is theirs
    return Heard(words, finished, logprobs)


async def store_transcript(
    history: History, emit: Callable[[Event], None], item_id: str, heard: Heard
) -> None:
    """Put `heard`'s words on the user item `item_id` and announce them (with their tokens'
    log-probabilities, if they have them), unless the item is gone or has its words already
    (then they were announced)."""
    stored = await history.get(item_id)
    if stored is None or stored.text:
        return
    stored.text = heard.words
    await history.update(stored)
    emit(
        InputTranscriptionCompleted(
            item_id=item_id, transcript=heard.words, logprobs=heard.logprobs
        )
    )


@dataclass(frozen=True, slots=True)
class _Pending:
    item_id: str
    begin_ms: int
    end_ms: int


AudioReader = Callable[[int, int], Awaitable[npt.NDArray[np.int16]]]


class ItemTranscriber:
    def __init__(
        self,
        session_id: str,
        pipeline: Pipeline,
        history: History,
        read_audio: AudioReader,
        emit: Callable[[Event], None],
        known: Callable[[str], Awaitable[Heard | None]] | None = None,
        hints: Callable[[], RecognitionHints] = lambda: NO_HINTS,
    ) -> None:
        """`known(item_id)`: the item's words if they were recognised already (at the
        turn's pause, turn_transcript.py), so that only the rest is recognised here;
        `hints()`: the session's language and prompt for recognising, as they are now."""
        self._hints = hints
        self._session_id = session_id
        self._pipeline = pipeline
        self._history = history
        self._read_audio = read_audio
        self._emit = emit
        self._known = known
        self._pending: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._current: str | None = None
        self._superseded = False
        """An answer started on the item being transcribed: it announces the words."""
        self.skipped = 0
        """Items that waited past MAX_PENDING and got no transcript."""

    def request(self, item_id: str, begin_ms: int, end_ms: int) -> None:
        """Transcribe the audio item `item_id` ([begin_ms, end_ms) on the input timeline)."""
        if len(self._pending) >= MAX_PENDING:
            dropped = self._pending.popleft()
            self.skipped += 1
            log.warning("session %s: no transcript for %s (queue full)", self._session_id, dropped)
        self._pending.append(_Pending(item_id, begin_ms, end_ms))
        self._wake.set()

    def answered(self, item_id: str) -> None:
        """An answer transcribes `item_id` itself: drop it if it is still waiting."""
        self._pending = deque(p for p in self._pending if p.item_id != item_id)
        if self._current == item_id:
            self._superseded = True

    async def run(self) -> None:
        """The transcriber's loop, until cancelled (by the session's close)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                item = self._pending.popleft()
                self._current, self._superseded = item.item_id, False
                try:
                    await self._transcribe(item)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning(
                        "session %s: transcribing %s failed: %r",
                        self._session_id,
                        item.item_id,
                        exc,
                    )
                    self._emit(InputTranscriptionFailed(item_id=item.item_id, message=str(exc)))
                finally:
                    self._current = None

    async def _transcribe(self, item: _Pending) -> None:
        known = await self._known(item.item_id) if self._known is not None else None
        if known is not None:
            await self._store(item.item_id, known)
            return
        pcm = await self._read_audio(item.begin_ms, item.end_ms)
        try:
            heard = await recognise(self._pipeline, pcm, hints=self._hints())
        except TranscriptionFailed as exc:
            self._emit(InputTranscriptionFailed(item_id=item.item_id, message=str(exc)))
            return
        if heard.words:  # in one piece: the delta is all of it
            delta = InputTranscriptionDelta(
                item_id=item.item_id, delta=heard.words, logprobs=heard.logprobs
            )
            self._emit(delta)
        await self._store(item.item_id, heard)

    async def _store(self, item_id: str, heard: Heard) -> None:
        if not self._superseded:  # else an answer has announced the words
            await store_transcript(self._history, self._emit, item_id, heard)
