"""What turn-taking (turn_taking.py) asks of its session: a small protocol, so that
turn-taking knows no transport, no Redis and no response, and a test can drive it with a
stand-in host (tests/sessions/test_turn_taking.py)."""

from __future__ import annotations

from typing import Protocol

from pipeline.types import PipelineRequest

from .events import ConversationItem, Event
from .prefetch import Prefetch
from .sink import OutputSink
from .transcription import Heard


class TurnHost(Protocol):
    """What turn-taking needs from its session."""

    @property
    def responding(self) -> bool:
        """An answer is generating or playing."""
        ...

    @property
    def closing(self) -> bool:
        """The session is ending: a silence no longer becomes a turn."""
        ...

    def emit(self, event: Event) -> None:
        """Tell the client (speech_started, speech_stopped, cleared, timeout_triggered)."""
        ...

    @property
    def sink(self) -> OutputSink:
        """The client's output: paused at once when speech may be a barge-in (its audio
        kept), resumed when it was not one (or nothing is left to hold)."""
        ...

    async def interrupt(self) -> None:
        """Barge-in: cut the answer in progress; the state becomes user_speaking."""
        ...

    async def commit_turn(self, item_id: str, begin_ms: int, end_ms: int) -> ConversationItem:
        """The user's audio [begin_ms, end_ms) becomes the user item `item_id`."""
        ...

    async def respond(self, prefetched: Prefetch | None = None) -> None:
        """Answer the committed turn now (adopting the answer begun ahead, if any)."""
        ...

    def transcribe(self, item_id: str, begin_ms: int, end_ms: int) -> None:
        """A committed turn no answer follows: recognise its audio for its transcript."""
        ...

    async def store_transcript(self, item_id: str, heard: Heard) -> None:
        """The words of a committed turn, recognised at its pause: stored and announced."""
        ...

    async def request_ahead(
        self, item_id: str, span_ms: tuple[int, int], words: str
    ) -> PipelineRequest:
        """The request an answer to `words` (the turn `item_id` so far) would make."""
        ...
