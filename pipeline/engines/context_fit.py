"""A conversation cut to fit an engine's context, as the session's `truncation` says.

An engine whose prompt carries the whole conversation meets, sooner or later, a conversation
longer than its context (`max_context`: prompt plus the reply's budget). OpenAI's Realtime
API says what then happens with the session's `truncation` (`pipeline.types.Truncation`):

- `auto`: the oldest history items leave the model's context, as few as make it fit;
- `retention_ratio`: when it does not fit (or the conversation after the instructions
  passes `post_instructions_tokens`), the oldest items leave until only that fraction of
  what may follow the instructions is used. Cutting more than needed keeps the prompt's
  beginning, and so a session's cached KV, the same for the next several turns;
- `disabled`: nothing leaves; the response fails with `context_length_exceeded`.

A turn that cannot fit even alone (instructions, the turn itself and the reply's budget)
fails whatever the setting. `fit` decides on token counts; `ContextCuts` remembers per
session which items left, so that they stay out on the later turns (the cut point moves
only forward, and the prompt's beginning changes only when it does). The session's own
history (in Redis, what the client sees) is never touched: the items only leave the
model's prompt, and OpenAI sends no event for it either.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ..types import PipelineRequest, Truncation

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""The ErrorChunk code (and the client's error code) of a conversation that cannot fit."""
MAX_SESSIONS = 16_384
"""Sessions whose cut points are remembered at most (least recently cut out first); a
session that ends is forgotten at once (`Engine.forget_session`), this bounds the rest."""


class ContextExceeded(Exception):
    """The prompt cannot fit the context under the session's truncation; the message has
    the figures."""


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A prompt's length in parts: what a cut may drop (`items`) and what it may not."""

    instructions: int
    """the system item (instructions and tool definitions)"""
    items: Sequence[int]
    """each history item, oldest first"""
    turn: int
    """this turn's user item and the opening of the reply"""
    downstream_items: Sequence[int] = ()
    """what each history item adds to a downstream stage's prompt (Qwen3-Omni's Talker
    takes the user items); empty: no such stage"""
    downstream_turn: int = 0
    """the downstream prompt's positions that no cut removes (this turn's and its own)"""

    @property
    def total(self) -> int:
        return self.instructions + sum(self.items) + self.turn


def fit(
    tokens: PromptTokens,
    *,
    reply: int,
    max_context: int,
    truncation: Truncation,
    downstream_room: int = 0,
) -> int:
    """How many of the oldest history items to leave out so that the prompt and `reply`
    tokens fit `max_context` (and the downstream stage's share fits `downstream_room`, if
    given); raises ContextExceeded when the setting forbids the cut or the turn cannot fit
    even alone."""
    room = max_context - reply - tokens.instructions
    """what may follow the instructions"""
    if tokens.turn > room:
        raise ContextExceeded(
            f"this turn needs {tokens.instructions + tokens.turn} tokens of instructions and "
            f"input plus {reply} for the reply, more than the model's context of "
            f"{max_context} tokens"
        )
    if downstream_room and tokens.downstream_turn > downstream_room:
        raise ContextExceeded(
            f"this turn needs {tokens.downstream_turn} positions of the speech model's "
            f"prompt, more than the {downstream_room} it holds"
        )
    limit = room
    if truncation.type == "retention_ratio" and truncation.post_instructions_tokens:
        limit = min(room, truncation.post_instructions_tokens)
    conversation = sum(tokens.items) + tokens.turn
    downstream = sum(tokens.downstream_items) + tokens.downstream_turn
    downstream_limit = downstream_room or downstream
    if conversation <= limit and downstream <= downstream_limit:
        return 0
    if truncation.type == "disabled":
        if conversation > limit:
            raise ContextExceeded(
                f"the conversation needs {tokens.total} tokens plus {reply} for the reply, "
                f"more than the model's context of {max_context} tokens, and the session's "
                "truncation is disabled"
            )
        raise ContextExceeded(
            f"the conversation needs {downstream} positions of the speech model's prompt, "
            f"more than the {downstream_room} it holds, and the session's truncation is "
            "disabled"
        )
    ratio = truncation.retention_ratio if truncation.type == "retention_ratio" else 1.0
    target, downstream_target = math.floor(ratio * limit), math.floor(ratio * downstream_limit)
    shares = list(tokens.downstream_items) or [0] * len(tokens.items)
    dropped = 0
    while dropped < len(tokens.items) and (conversation > target or downstream > downstream_target):
        conversation -= tokens.items[dropped]
        downstream -= shares[dropped]
        dropped += 1
    return dropped


class ContextCuts:
    """Per session, the history items its cuts have left out of the model's prompt.

    A request is seen through its session's cuts (`view`): those items are gone from its
    history and its item ids, so a session's cached KV is matched (and kept) against what
    the model actually read. Not thread-safe: used on the event loop only."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._dropped: OrderedDict[str, frozenset[str]] = OrderedDict()
        self.cuts = 0
        """Cuts made (each one leaves one or more items out), for tests and metrics."""

    def dropped(self, session_id: str) -> frozenset[str]:
        return self._dropped.get(session_id, frozenset())

    def view(self, request: PipelineRequest) -> PipelineRequest:
        """`request` less the items its session's cuts left out."""
        gone = self.dropped(request.session_id)
        if not gone:
            return request
        return dataclasses.replace(
            request,
            history=tuple(item for item in request.history if item.item_id not in gone),
            item_ids=tuple(i for i in request.item_ids if i not in gone),
        )

    def cut(self, request: PipelineRequest, count: int) -> PipelineRequest:
        """Leave the `count` oldest history items of `request` (a view) out, for this
        request and the session's later ones; the request without them."""
        if count <= 0:
            return request
        self.cuts += 1
        gone = {item.item_id for item in request.history[:count]}
        if request.session_id:
            self._dropped[request.session_id] = self.dropped(request.session_id) | gone
            self._dropped.move_to_end(request.session_id)
            while len(self._dropped) > self.max_sessions:
                self._dropped.popitem(last=False)
        return dataclasses.replace(
            request,
            history=tuple(request.history[count:]),
            item_ids=tuple(i for i in request.item_ids if i not in gone),
        )

    def forget(self, session_id: str) -> None:
        self._dropped.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._dropped)
