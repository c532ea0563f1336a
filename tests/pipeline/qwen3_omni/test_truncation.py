"""A conversation longer than the Thinker's context, cut as the session's truncation says:
`auto` keeps answering within the context, `retention_ratio` cuts once and the session's KV
is reused on the turns after, `disabled` fails with context_length_exceeded; items once cut
stay cut; a turn that cannot fit alone fails whatever the setting."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from transformers import Qwen3OmniMoeConfig

from pipeline.engines.qwen3_omni.prompt import ByteVocab, chat_prompt
from pipeline.engines.qwen3_omni.session_kv import talker_prompt_length
from pipeline.engines.qwen3_omni.talker_runner import TalkerRunner
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.engines.qwen3_omni.thinker_runner import ThinkerPrompt, ThinkerRunner
from pipeline.types import (
    Chunk,
    End,
    ErrorChunk,
    HiddenStates,
    HistoryItem,
    PipelineRequest,
    TextDelta,
    Truncation,
)

from .conftest import open_talker

CONTEXT = 512
REPLY = 4
"""Reply tokens per turn (random weights never stop by themselves); the last is never fed."""
QUESTION = "Question {k}: what will the weather be like tomorrow in the city?"
"""~65 tokens a user item (the byte vocabulary: one token a byte)."""


@pytest.fixture
async def thinker() -> AsyncIterator[ThinkerEngine]:
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_new_tokens=REPLY,
        min_new_tokens=REPLY,
        session_kv_tokens=4096,
        max_context=CONTEXT,
        default_instructions="Be brief.",
    )
    await engine.start()
    yield engine
    await engine.close()


@dataclass
class Turn:
    chunks: list[Chunk]
    prefilled: int
    """positions this turn's prefill computed"""
    fed: int
    """positions the session's entry holds after it (prompt and reply fed)"""
    cuts: int
    """cuts made so far"""

    @property
    def error(self) -> ErrorChunk | None:
        last = self.chunks[-1]
        return last if isinstance(last, ErrorChunk) else None


@dataclass
class Conversation:
    engine: ThinkerEngine
    truncation: Truncation
    session: str = "s"
    history: list[HistoryItem] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    async def turn(self, text: str | None = None) -> Turn:
        k = len(self.turns)
        said = text if text is not None else QUESTION.format(k=k)
        request = PipelineRequest(
            request_id=f"r{k}",
            audio=np.zeros(0, dtype=np.int16),
            text=said,
            history=tuple(self.history),
            session_id=self.session,
            item_ids=(*(item.item_id for item in self.history), f"u{k}"),
            truncation=self.truncation,
        )
        chunks = [c async for c in self.engine.generate(request.request_id, request)]
        reply = "".join(c.text for c in chunks if isinstance(c, TextDelta)).strip()
        if isinstance(chunks[-1], End):
            self.history += [
                HistoryItem("user", said, f"u{k}"),
                HistoryItem("assistant", reply, f"a{k}"),
            ]
        assert self.engine.runner is not None and self.engine.sessions is not None
        entry = self.engine.sessions.get(self.session)
        done = Turn(
            chunks,
            self.engine.runner.last_prefill_tokens,
            entry.tokens if entry is not None else 0,
            self.engine.cuts.cuts,
        )
        self.turns.append(done)
        return done


async def test_auto_keeps_answering_a_long_conversation_within_the_context(
    thinker: ThinkerEngine,
) -> None:
    talk = Conversation(thinker, Truncation("auto"))
    for _ in range(12):  # ~90 tokens a turn: the context is full after ~5
        turn = await talk.turn()
        assert turn.error is None, turn.error
        assert turn.fed > 0 and turn.fed + 1 <= CONTEXT  # prompt, reply fed, and its last
    assert talk.turns[-1].cuts >= 1
    gone = thinker.cuts.dropped("s")
    assert {"u0", "a0"} <= gone and "u11" not in gone  # the oldest first, never the turn
    entry = thinker.sessions.get("s") if thinker.sessions is not None else None
    assert entry is not None
    assert not gone & {item.item_id for item in entry.conversation.history}


async def test_retention_ratio_cuts_once_and_the_session_kv_serves_the_turns_after(
    thinker: ThinkerEngine,
) -> None:
    talk = Conversation(thinker, Truncation("retention_ratio", retention_ratio=0.5))
    while not (turn := await talk.turn()).cuts:
        assert turn.error is None and len(talk.turns) < 10
    cut_at = len(talk.turns) - 1
    assert turn.prefilled == turn.fed - (REPLY - 1)  # the cut changed the beginning: in full
    assert turn.prefilled <= CONTEXT // 2 + 16  # cut to half of what may follow the system
    for _ in range(2):  # the next turns go on from the entry: only what they add
        after = await talk.turn()
        assert after.error is None and after.cuts == 1
        assert after.prefilled < 100, after.prefilled
    assert len(talk.turns) == cut_at + 3


async def test_disabled_fails_with_context_length_exceeded_when_full(
    thinker: ThinkerEngine,
) -> None:
    talk = Conversation(thinker, Truncation("disabled"))
    while (turn := await talk.turn()).error is None:
        assert len(talk.turns) < 10
    assert turn.error is not None
    assert turn.error.code == "context_length_exceeded"
    assert f"context of {CONTEXT} tokens" in turn.error.message
    assert "disabled" in turn.error.message
    assert len(talk.turns) > 2 and thinker.cuts.cuts == 0
    assert thinker.active_requests() == 0


async def test_a_turn_too_long_for_the_context_alone_fails_whatever_the_setting(
    thinker: ThinkerEngine,
) -> None:
    talk = Conversation(thinker, Truncation("auto"))
    assert (await talk.turn()).error is None
    turn = await talk.turn(text="x" * CONTEXT)
    assert turn.error is not None and turn.error.code == "context_length_exceeded"
    assert "this turn needs" in turn.error.message
    assert (await talk.turn()).error is None  # the session goes on


async def test_cut_items_stay_cut_until_the_session_ends(thinker: ThinkerEngine) -> None:
    talk = Conversation(thinker, Truncation("retention_ratio", retention_ratio=0.5))
    while not (await talk.turn()).cuts:
        pass
    assert thinker.cuts.dropped("s")
    assert thinker.sessions is not None
    thinker.sessions.forget("s")  # the KV entry gone: the next turn is built from history
    turn = await talk.turn()
    assert turn.error is None and turn.cuts == 1  # built without the cut items, no new cut
    assert turn.prefilled < CONTEXT // 2 + 100
    await thinker.forget_session("s")
    assert not thinker.cuts.dropped("s")


def test_the_talkers_prompt_is_as_long_as_the_thinker_counts_it(
    tiny_parts: dict[str, tuple[Any, Qwen3OmniMoeConfig]],
) -> None:
    """`talker_prompt_length` (what a cut holds to `talker_prompt_tokens`) is the length of
    the prompt the Talker really prefills: its user items and the positions it adds."""
    history = [("user", "What is the weather?"), ("assistant", "Sunny."), ("user", "And then?")]
    ids = chat_prompt(ByteVocab(), instructions="Be brief.", history=history,
                      audio_tokens=0, text="Tomorrow?")  # fmt: skip
    (thinker_model, config), (talker_model, talker_config) = (
        tiny_parts["thinker"],
        tiny_parts["talker"],
    )
    thinker = ThinkerRunner(thinker_model, config)
    talker = TalkerRunner(talker_model, talker_config)
    talking = open_talker(thinker, talker, ThinkerPrompt(ids), reply_tokens=2)
    assert talking.length == talker_prompt_length(ids)


async def test_the_talkers_share_is_cut_to_its_room_too() -> None:
    """A Thinker feeding a Talker whose row holds fewer prompt positions than the Thinker's
    context: the user items are cut to the Talker's room though the Thinker's fits."""
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_new_tokens=REPLY,
        min_new_tokens=REPLY,
        session_kv_tokens=4096,
        max_context=CONTEXT,
        talker_prompt_tokens=200,
    )
    await engine.start()
    try:
        talk = Conversation(engine, Truncation("auto"))
        for _ in range(4):  # ~70 Talker positions a turn: over 200 from the third
            turn = await talk.turn()
            assert turn.error is None
            prompt = turn.chunks[0]
            assert isinstance(prompt, HiddenStates)
            assert talker_prompt_length(prompt.metadata["token_ids"]) <= 200
            assert turn.fed + 1 <= CONTEXT
        assert engine.cuts.cuts >= 1
    finally:
        await engine.close()
