"""A session's turns: where each user turn's audio lies, and what the next answer answers.

The input audio is one timeline, in milliseconds since the session began. A committed user
turn is a range on it, kept until the answer to it reads that audio (or the item is
deleted). What the next answer answers is the *pending input*: the last user item, and
before it, committed speech that a typed message followed before any answer. Speech then a
typed question is one turn, whatever the transport (the video chat commits what was heard,
then sends the question; an OpenAI client may commit audio, then add a text item): the
answer's request carries the speech's audio and the question's text, and neither is
history yet.

Each turn also keeps its moment on the wall clock, for the camera frames that go with it
(frame_window.py): when its first audio arrived (audio_arrivals.py) and when it was
committed.

This is bookkeeping only. The session decides the states, the events and the transitions
around it, under its media lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .audio_arrivals import AudioArrivals, wall_ms
from .events import new_id

MIN_COMMIT_MS = 100
"""The least uncommitted audio that a manual commit makes a turn of."""


@dataclass(frozen=True, slots=True)
class TurnAudio:
    """A committed user item's audio: [begin_ms, end_ms) on the input timeline; on the
    wall clock, its first audio arrived at `arrived_ms` and it was committed at
    `committed_ms`."""

    item_id: str
    begin_ms: int
    end_ms: int
    arrived_ms: int = field(default=0, compare=False)
    committed_ms: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class TurnInput:
    """The items one answer answers, taken from the pending input when it starts."""

    user_item_id: str | None
    """The last user item (spoken or typed) before the answer."""
    speech_item_id: str | None = None
    """Committed speech that the typed `user_item_id` followed: the same turn."""

    @property
    def item_ids(self) -> tuple[str, ...]:
        """The turn's items in conversation order: the speech, then what followed it."""
        return tuple(i for i in (self.speech_item_id, self.user_item_id) if i is not None)

    @property
    def transcript_item_id(self) -> str | None:
        """The item that the pipeline's transcript of the turn's audio belongs to."""
        return self.speech_item_id or self.user_item_id

    def text_item_id(self, audio: TurnAudio | None) -> str | None:
        """The item whose text the request carries: the user item, unless it is the audio."""
        if self.user_item_id is None or (audio is not None and audio.item_id == self.user_item_id):
            return None
        return self.user_item_id


class Turns:
    def __init__(self, now_ms: Callable[[], int] = wall_ms) -> None:
        self.arrivals = AudioArrivals(now_ms)
        """When each stretch of the input audio arrived."""
        self.offset_ms = 0
        """End of the input audio received so far, on the session's audio timeline."""
        self.uncommitted_from_ms = 0
        """Start of the input audio that no turn holds yet (cleared audio counts as held)."""
        self.speech_item_id: str | None = None
        """The item of the speech the turn detector is hearing now, if any."""
        self._ranges: dict[str, TurnAudio] = {}
        """User audio items awaiting an answer -> their audio."""
        self._user_item: str | None = None
        self._speech: str | None = None

    @property
    def uncommitted_ms(self) -> int:
        return self.offset_ms - self.uncommitted_from_ms

    def received(self, duration_ms: int) -> int:
        """`duration_ms` more input audio arrived; returns where it starts."""
        first = self.offset_ms
        self.offset_ms += duration_ms
        self.arrivals.heard(self.offset_ms)
        return first

    def speech_started(self) -> str:
        """The detector heard speech begin: returns the item id it will have."""
        self.speech_item_id = new_id("item")
        return self.speech_item_id

    def speech_stopped(self) -> str:
        """The detector heard the speech end: returns its item id."""
        item_id, self.speech_item_id = self.speech_item_id or new_id("item"), None
        return item_id

    def speech_begin_ms(self, start_ms: int, padding_ms: int) -> int:
        """Where a detected turn's audio begins: `padding_ms` before the speech, but never
        into audio an earlier turn holds."""
        return max(self.uncommitted_from_ms, start_ms - padding_ms, 0)

    def committed(self, item_id: str, begin_ms: int, end_ms: int) -> None:
        """A user audio item holds [begin_ms, end_ms); it is the pending input now."""
        self.uncommitted_from_ms = end_ms
        arrived, now = self.arrivals.at(begin_ms), self.arrivals.now_ms()
        self._ranges[item_id] = TurnAudio(item_id, begin_ms, end_ms, arrived, now)
        self._user_item = item_id
        self._speech = None

    def cleared(self) -> None:
        """The uncommitted audio was dropped, and with it any speech in progress."""
        self.uncommitted_from_ms = self.offset_ms
        self.speech_item_id = None

    def typed(self, item_id: str) -> None:
        """A typed user message: the pending input; committed speech before it, still
        unanswered, is the same turn."""
        if self._user_item in self._ranges:
            self._speech = self._user_item
        self._user_item = item_id

    def take(self) -> TurnInput:
        """An answer starts: it answers the pending input, which is empty again."""
        turn = TurnInput(self._user_item, self._speech)
        self._user_item = self._speech = None
        return turn

    def claim_audio(self, turn: TurnInput) -> TurnAudio | None:
        """The audio the answer to `turn` hears: the user item's, or the speech's before a
        typed question. Claimed once; a deleted item has none."""
        user, speech = turn.user_item_id, turn.speech_item_id
        item_id = user if user in self._ranges else speech
        if item_id is None or item_id not in self._ranges:
            return None
        return self._ranges.pop(item_id)

    def forget(self, item_id: str) -> None:
        """The item was deleted from the conversation: no turn answers it any more."""
        self._ranges.pop(item_id, None)
        if self._user_item == item_id:
            self._user_item = None
        if self._speech == item_id:
            self._speech = None
