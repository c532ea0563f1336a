"""A Thinker turn's prompt fitted to the context, at the turn's end and ahead of it.

At the turn's end (`ThinkerEngine._fitted_prompt`) the prompt goes on from the session's
entry where that fits, else it is built from the history, cut as the request's truncation
says (`context_fit.py`). A turn streamed while the user speaks (`streamed_turns.py`) needs
the same prompt's beginning before the turn's audio is known: its lead. Past the context,
the lead is cut too, with room for `LEAD_AUDIO_TOKENS` of audio (the turn's real length is
known only at its end), and the turn's end takes the lead's cut wherever the whole turn
fits with it, so a long conversation's turns are still prefilled while the user speaks
(without this every turn past the context was a whole prefill after the user stopped: with
`truncation: auto`, every turn once the context is full).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...types import Truncation
from ..context_fit import ContextExceeded, fit
from .audio_features import audio_token_count
from .config import TOKENS
from .prompt import ChatParts
from .session_kv import PromptMedia, SessionEntry, talker_prompt_length
from .thinker_runner import ThinkerPast, ThinkerPrompt

LEAD_AUDIO_TOKENS = audio_token_count(20 * 100)
"""A lead cut past the context leaves room for 20 s of the turn's audio (100 log-mel frames a
second): a longer turn is cut again at its end and taken whole."""


@dataclass(frozen=True, slots=True)
class ContextLimits:
    """What a Thinker prompt must fit."""

    max_context: int
    """prompt and reply"""
    reply: int
    """the reply's budget (`max_new_tokens`: what a cache row reserves)"""
    talker: int
    """the Talker's prompt room (0: no Talker, or no limit of its own)"""

    def holds(self, ids: list[int]) -> bool:
        """Whether a prompt of `ids` and its reply fit (the Talker's share too)."""
        if len(ids) + self.reply > self.max_context:
            return False
        return not self.talker or talker_prompt_length(ids) <= self.talker

    def dropped(self, parts: ChatParts, truncation: Truncation) -> int:
        """The oldest history items a cut leaves out of `parts` (ContextExceeded where the
        setting forbids it or the turn cannot fit alone)."""
        return fit(
            parts.tokens(talker=bool(self.talker)),
            reply=self.reply,
            max_context=self.max_context,
            truncation=truncation,
            downstream_room=self.talker,
        )

    def cut(self, parts: ChatParts, truncation: Truncation, planned: int = 0) -> int:
        """As `dropped`, but a cut `planned` ahead (a streamed turn's lead) is kept where the
        prompt fits with it, so that the turn's end builds the prompt the lead began."""
        if planned:
            try:
                if self.dropped(parts.without_oldest(planned), truncation) == 0:
                    return planned
            except ContextExceeded:
                pass
        return self.dropped(parts, truncation)


@dataclass(frozen=True, slots=True)
class Lead:
    """Where a streamed turn goes on from: the session's entry (None: the prompt's start)
    and the prompt's ids after it up to `<|audio_start|>`, as the turn's request will have
    them if nothing changes until its end; `dropped`: the history items its cut left out
    (the entry is None then)."""

    entry: SessionEntry | None
    ids: list[int]
    dropped: int = 0


def lead_after_entry(entry: SessionEntry, parts: ChatParts, limits: ContextLimits) -> Lead | None:
    """The lead going on from `entry`, whose `parts` are what the turn adds (no instructions,
    one audio placeholder), or None where the prompt would not fit the context."""
    base = entry.token_ids + entry.tail
    ids = base + parts.ids()
    if not limits.holds(ids):
        return None
    return Lead(entry, ids[entry.tokens : ids.index(TOKENS["audio"], len(base))])


def lead_from_history(
    parts: ChatParts, limits: ContextLimits, truncation: Truncation
) -> Lead | None:
    """The lead of a prompt built from the history (`parts`: instructions, the history and
    `LEAD_AUDIO_TOKENS` placeholders), cut as `truncation` says; None where it cannot be."""
    try:
        dropped = limits.dropped(parts, truncation)
    except ContextExceeded:
        return None
    ids = parts.without_oldest(dropped).ids()
    return Lead(None, ids[: ids.index(TOKENS["audio"])], dropped)


@dataclass(frozen=True, slots=True)
class FittedPrompt:
    """A turn's prompt as it fits the context, and what it goes on from."""

    prompt: ThinkerPrompt
    past: ThinkerPast | None
    """the session's entry's KV (None: a full prefill)"""
    dropped: int
    """the oldest history items left out now (0: no cut)"""
    tokens: int
    """the prompt's tokens before the cut (0: no cut was considered)"""
    earlier: PromptMedia = PromptMedia()
    """the media of the past's placeholders (none without a past)"""
