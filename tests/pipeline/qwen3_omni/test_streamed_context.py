"""A spoken turn of a conversation longer than the context is still streamed to the Thinker
while the user speaks: its lead is cut as the turn's end will cut it (room left for the
turn's audio), the turn's end keeps that cut, and only the turn's audio and closing tokens
are left to prefill. It answers as the same turn taken whole with the same items left out.
Before, such a turn counted `failed` and was prefilled whole after the user stopped: with
`truncation: auto`, every turn once the context was full."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import numpy as np
import numpy.typing as npt
import pytest

from pipeline.engines.qwen3_omni.prompt_fit import LEAD_AUDIO_TOKENS
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.types import HistoryItem, PipelineRequest, Truncation

from .conftest import turn_audio
from .test_streamed_turns import REPLY, answer, assert_same, closing, prefilled, stream

CONTEXT = 900
QUESTION = "Question {k}: what will the weather be like tomorrow in the city?"
"""~65 tokens a text item (the byte vocabulary: one token a byte)."""


@pytest.fixture
async def thinker() -> AsyncIterator[ThinkerEngine]:
    engine = ThinkerEngine(
        tiny=True,
        threads=1,
        max_new_tokens=REPLY,
        min_new_tokens=REPLY,
        session_kv_tokens=8192,
        max_context=CONTEXT,
        default_instructions="Be brief.",
    )
    await engine.start()
    assert engine.streamed is not None
    engine.streamed.staging.gather_s = 0.01
    yield engine
    await engine.close()


def history(items: int) -> tuple[HistoryItem, ...]:
    """A conversation of `items` text items (user and assistant in turn), ~65 tokens each."""
    roles: tuple[Literal["user"], Literal["assistant"]] = ("user", "assistant")
    return tuple(HistoryItem(roles[k % 2], QUESTION.format(k=k), f"i{k}") for k in range(items))


def spoken(
    rid: str,
    session: str,
    past: tuple[HistoryItem, ...],
    audio: npt.NDArray[np.int16] | None = None,
    streamed: str = "",
) -> PipelineRequest:
    return PipelineRequest(
        request_id=rid,
        audio=audio if audio is not None else np.zeros(0, dtype=np.int16),
        history=past,
        session_id=session,
        item_ids=(*(item.item_id for item in past), "u"),
        truncation=Truncation("auto"),
        streamed_turn=streamed,
    )


async def test_a_turn_past_the_context_is_cut_ahead_and_prefilled_as_the_user_speaks(
    thinker: ThinkerEngine,
) -> None:
    past = history(16)  # ~1,050 tokens: past the context of 900
    audio = turn_audio(2.0, seed=12)
    assert thinker.streamed is not None
    await stream(thinker, "t1", spoken("x", "streamed", past), audio)
    staged = thinker.streamed.staged_positions("t1")
    assert staged > 0  # the cut prompt's beginning is in before the turn ends
    turn = spoken("s1", "streamed", past, audio, streamed="t1")
    streamed = await answer(thinker, turn)
    assert thinker.streamed_turns()["prefilled"] == 1
    assert prefilled(thinker) == closing(len(audio) // 160, 0)  # its audio and closing only
    gone = thinker.cuts.dropped("streamed")
    assert gone and len(gone) < len(past)  # the oldest items, not the conversation
    assert {f"i{k}" for k in range(len(gone))} == gone
    kept = tuple(item for item in past if item.item_id not in gone)
    whole = await answer(thinker, spoken("w1", "whole", kept, audio))
    assert_same(streamed, whole)  # as the whole turn with the same items left out
    assert thinker.cuts.dropped("whole") == frozenset()


async def test_the_lead_leaves_room_for_the_turns_audio(thinker: ThinkerEngine) -> None:
    """The lead's cut leaves out at least as many items as a turn of `LEAD_AUDIO_TOKENS` of
    audio needs; the turn's end keeps it, where a whole turn of 2 s would drop fewer."""
    past = history(16)
    audio = turn_audio(2.0, seed=13)
    whole = await answer(thinker, spoken("w2", "w", past, audio))
    assert whole
    at_end = len(thinker.cuts.dropped("w"))
    await stream(thinker, "t2", spoken("x", "s", past), audio)
    await answer(thinker, spoken("s2", "s", past, audio, streamed="t2"))
    assert thinker.streamed is not None and thinker.streamed_turns()["prefilled"] == 1
    ahead = len(thinker.cuts.dropped("s"))
    assert ahead >= at_end and LEAD_AUDIO_TOKENS > 26  # 20 s of room against 2 s


async def test_a_turn_longer_than_the_room_left_is_taken_whole(thinker: ThinkerEngine) -> None:
    """A turn whose audio outgrows the room the lead left (past 20 s): the turn's end cuts
    again, so the lead is not the prompt's beginning and the turn is taken whole."""
    past = history(10)
    audio = turn_audio(24.0, seed=14)
    await stream(thinker, "t3", spoken("x", "long", past), audio)
    got = await answer(thinker, spoken("l1", "long", past, audio, streamed="t3"))
    assert got
    assert thinker.streamed is not None
    counts = thinker.streamed_turns()
    assert counts["prefilled"] == 0 and counts["changed"] + counts["failed"] == 1
