"""The Thinker with int8 matrices answers as the float one does, batching included."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from loadtest.questions import QUESTIONS, Question, hits
from pipeline.engines.cascade.smollm import LanguageModel
from pipeline.engines.cascade.thinker import ThinkerEngine
from pipeline.types import Chunk, End, PipelineRequest, TextDelta

ASKED = (QUESTIONS[0], QUESTIONS[4])
"""The capital of France ("paris") and a spider's legs ("eight"): both weight formats name
the key word within a few tokens."""


async def answers(weights: str, asked: tuple[Question, ...]) -> tuple[list[Chunk], ...]:
    engine = ThinkerEngine(max_new_tokens=10, batch_window_ms=50, weights=weights)
    await engine.start()
    try:

        async def ask(rid: str, question: Question) -> list[Chunk]:
            request = PipelineRequest(rid, np.zeros(0, dtype=np.int16), text=question.text)
            return [c async for c in engine.generate(rid, request)]

        replies = await asyncio.gather(*(ask(f"q{i}", q) for i, q in enumerate(asked)))
        assert engine.batch_size == len(asked)  # the questions ran as one batch
        assert engine.active_requests() == 0
        return tuple(replies)
    finally:
        await engine.close()


def said(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta) and c.kind == "output")


async def test_int8_answers_name_the_same_key_words_in_a_batch(
    language_model: LanguageModel, int8_language_model: LanguageModel
) -> None:
    float_replies = await answers("fp32", ASKED)
    int8_replies = await answers("int8", ASKED)
    for question, fp32, int8 in zip(ASKED, float_replies, int8_replies, strict=True):
        print(f"\n{question.text} fp32: {said(fp32)!r}; int8: {said(int8)!r}")
        assert isinstance(int8[-1], End)
        assert hits(said(fp32), question.keywords) and hits(said(int8), question.keywords)


def test_an_unknown_weight_format_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="weights"):
        ThinkerEngine(weights="int4")
