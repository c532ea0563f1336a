"""A session's Thinker KV kept between its turns: turn N prefills only what it adds.

The prefix cache (`prefix_cache.py`) reuses only the text a prompt starts with, and the
history reaches the Thinker as text, so a spoken question is gone from the next turn's prompt
(it has no text) and everything from the last turn's audio on is prefilled again. This store
keeps, per session, exactly what the Thinker was fed in its last turn: the whole prompt (audio
and image placeholders included, their KV computed from this turn's media), the reply tokens
fed, their KV, the per-position hidden states (the Talker's prompt needs them), and the mRoPE
position the next token takes. The next turn of the session feeds `tail` (the reply's last
chosen token, never fed, unless it was `<|im_end|>`; then `<|im_end|>\\n`), the items added
since, its own user turn and the assistant's opening, and prefills only those.

The Talker's prompt takes every user item, as transformers' generate() builds it for the
whole conversation: a spoken or visual item of an earlier turn goes with the Thinker's hidden
states of its placeholders, and the Talker places its audio and images by their lengths and
patch grids (`PromptMedia`), which the entry keeps for every medium in its tokens.

An entry is used only while the conversation is the one it saw (`continuation`): the same
instructions, the same items in the same order, and the reply recorded in full as the
session's assistant item. A truncated (barge-in), deleted or edited history does not match:
the entry is dropped and the turn is prefilled from its history as before. An entry is taken
out of the store for its turn and stored again at the turn's end, so an aborted turn leaves
nothing behind. Bounded twice: an entry longer than `max_tokens` is not kept (never a partial
one), and the store holds at most `budget_tokens` over all sessions, least recently used
session out first. `forget` drops a session's entry when it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from transformers import DynamicCache

from ...engine_limits import TALKER_PROMPT_EXTRA
from ...types import HistoryItem, PipelineRequest
from ..token_lru import TokenLRU
from .audio_features import AudioInput
from .config import TOKENS
from .thinker_runner import ThinkerPast, ThinkerState
from .vision_input import VisionInput

Hidden = npt.NDArray[np.floating]
MULTIMODAL = frozenset({TOKENS["audio"], TOKENS["image"], TOKENS["video"]})
MEDIA_MARKUP = MULTIMODAL | {
    TOKENS[name] for name in ("audio_start", "audio_end", "vision_start", "vision_end")
}
"""Ids that a prompt may hold only around its own media: a reply token among them (random
weights choose any id) cannot be fed again in the next turn's prompt."""


@dataclass(frozen=True, slots=True)
class PromptMedia:
    """The media behind a prompt's placeholders, in prompt order: each audio's mel frames and
    each image's patch grid. The Talker's mRoPE positions need them for every audio and image
    in its prompt (`get_rope_index` takes the n-th of each for the n-th placeholder run)."""

    audio_lengths: tuple[int, ...] = ()
    image_grids: tuple[tuple[int, int, int], ...] = ()

    def then(self, audio: AudioInput | None, vision: VisionInput | None) -> PromptMedia:
        """These media followed by a turn's own (a turn puts its images before its audio,
        but each kind keeps its own order, which is all the positions read)."""
        lengths = tuple(int(n) for n in audio.mask.sum(dim=1).tolist()) if audio else ()
        grids = vision.grid_thw.tolist() if vision else []
        images = tuple((int(t), int(h), int(w)) for t, h, w in grids)
        return PromptMedia(self.audio_lengths + lengths, self.image_grids + images)


@dataclass(frozen=True, slots=True)
class Conversation:
    """What an entry's tokens hold, as the session's request said it."""

    instructions: str
    item_ids: tuple[str, ...]
    """every item of the conversation up to and including the turn (PipelineRequest.item_ids)"""
    history: tuple[HistoryItem, ...]
    reply: str
    """the reply's text as the session records it (the deltas joined, stripped)"""


@dataclass(frozen=True, slots=True)
class SessionEntry:
    conversation: Conversation
    token_ids: list[int]
    """every token fed: the prompt, then the reply's tokens but the last"""
    tail: list[int]
    """fed first in the next turn: the reply's unfed last token (unless <|im_end|>), then
    <|im_end|> and a newline"""
    cache: DynamicCache
    hidden: Hidden
    """[len(token_ids), 2, hidden]"""
    rope_delta: int
    """the next position is len(token_ids) + rope_delta (mRoPE: text goes on from max + 1)"""
    media: PromptMedia = PromptMedia()
    """the media of every audio and image placeholder in `token_ids`"""

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class Resumed:
    """A turn going on from its session's entry, with the history items added since."""

    entry: SessionEntry
    added: list[HistoryItem]

    def past(self) -> ThinkerPast:
        entry = self.entry
        return ThinkerPast(entry.cache, entry.tokens, entry.rope_delta, entry.hidden)


def continuation(
    entry: SessionEntry,
    *,
    instructions: str,
    item_ids: Sequence[str],
    history: Sequence[HistoryItem],
) -> list[HistoryItem] | None:
    """The history items added since the entry's turn, or None when the request's
    conversation is not the one the entry holds followed by the entry's reply."""
    seen = entry.conversation
    count = len(seen.item_ids)
    if instructions != seen.instructions or tuple(item_ids[:count]) != seen.item_ids:
        return None
    if len(item_ids) <= count:
        return None
    by_id = {item.item_id: item for item in history}
    reply = by_id.get(item_ids[count])
    if reply is None or reply.role != "assistant" or reply.text != seen.reply:
        return None  # truncated, deleted, or never recorded
    before = {item.item_id for item in seen.history}
    if tuple(item for item in history if item.item_id in before) != seen.history:
        return None  # an earlier item was edited or deleted
    added = set(item_ids[count + 1 :])
    return [item for item in history if item.item_id in added]


def talker_prompt_length(token_ids: Sequence[int]) -> int:
    """The Talker's prompt length for this Thinker prompt: its user items (every one, spoken
    and visual ones included) and the positions the Talker adds."""
    starts = [i for i, t in enumerate(token_ids) if t == TOKENS["im_start"]] + [len(token_ids)]
    users = sum(
        end - begin
        for begin, end in zip(starts, starts[1:], strict=False)
        if token_ids[begin + 1] == TOKENS["user"]
    )
    return users + TALKER_PROMPT_EXTRA


class SessionKV:
    def __init__(self, budget_tokens: int, max_tokens: int = 0) -> None:
        self._entries: TokenLRU[str, SessionEntry] = TokenLRU(budget_tokens)
        self.budget_tokens = budget_tokens
        self.max_tokens = min(max_tokens or budget_tokens, budget_tokens)
        """One session's entry is kept only up to this many tokens."""
        self.evicted = 0
        """Entries dropped for the budgets (not counting forgotten or mismatched ones)."""

    @property
    def tokens(self) -> int:
        """Tokens of KV held now (never more than `budget_tokens`)."""
        return self._entries.tokens

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def get(self, session_id: str) -> SessionEntry | None:
        """The session's entry, left in place (for looking at it)."""
        return self._entries.get(session_id)

    def take(self, session_id: str) -> SessionEntry | None:
        """The session's entry, out of the store: its turn owns the cache now."""
        return self._entries.pop(session_id)

    def store(self, session_id: str, entry: SessionEntry) -> bool:
        """Keep the session's entry (replacing any); False when it is over `max_tokens`,
        then the session has none."""
        self.forget(session_id)
        if entry.tokens > self.max_tokens:
            self.evicted += 1
            return False
        self.evicted += self._entries.put(session_id, entry, entry.tokens)
        return True

    def forget(self, session_id: str) -> bool:
        return self.take(session_id) is not None

    def resume(self, request: PipelineRequest, instructions: str) -> Resumed | None:
        """The session's entry, taken for this turn, when the request goes on from it; an
        entry that the conversation no longer matches is dropped."""
        if not request.session_id or not request.item_ids:
            return None
        entry = self.take(request.session_id)
        if entry is None:
            return None
        added = continuation(
            entry, instructions=instructions, item_ids=request.item_ids, history=request.history
        )
        return Resumed(entry, added) if added is not None else None

    def keep_turn(
        self,
        request: PipelineRequest,
        *,
        instructions: str,
        prompt_ids: Sequence[int],
        state: ThinkerState,
        hidden: list[npt.NDArray[Any]],
        reply: str,
        media: PromptMedia,
        eos_id: int,
    ) -> None:
        """At the turn's end: keep what the Thinker was fed (prompt and reply) for the
        session's next turn. The reply's last chosen token was never fed."""
        if not request.session_id or not request.item_ids:
            return
        *fed, last = state.generated
        token_ids = list(prompt_ids) + fed
        if state.length != len(token_ids) or state.cache.get_seq_length() != len(token_ids):
            self.forget(request.session_id)  # not what it looks like: keep nothing
            return
        if last in MEDIA_MARKUP:  # the next prompt cannot carry it: that turn starts afresh
            self.forget(request.session_id)
            return
        tail = [last] if last != eos_id else []
        entry = SessionEntry(
            conversation=Conversation(
                instructions=instructions,
                item_ids=tuple(request.item_ids),
                history=tuple(request.history),
                reply=reply.strip(),
            ),
            token_ids=token_ids,
            tail=[*tail, TOKENS["im_end"], TOKENS["newline"]],
            cache=state.cache,
            hidden=np.concatenate(hidden),
            rope_delta=state.rope_delta,
            media=media,
        )
        self.store(request.session_id, entry)

    def clear(self) -> None:
        self._entries.clear()
