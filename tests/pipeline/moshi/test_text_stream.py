"""Moshi's text tokens as a transcript: pieces decoded as the tokenizer joins them, pauses
between words, padding never said; the toy model's frames carry words."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.engines.moshi.duplex_engine import MoshiDuplexEngine
from pipeline.engines.moshi.frame_step import Sampling
from pipeline.engines.moshi.text_stream import TextPieces, skipped_ids, toy_tokenizer


def sentencepiece_like() -> Any:
    """Pieces with SentencePiece's word-start mark, as Kyutai's tokenizer writes them."""
    from tokenizers import Tokenizer, decoders, models  # type: ignore[import-untyped]
    from transformers import PreTrainedTokenizerFast

    vocab = {"<epad>": 0, "<unk>": 1, "<eos>": 2, "<pad>": 3, "▁hel": 4, "lo": 5, "▁there": 6}
    model = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    model.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=model, unk_token="<unk>", pad_token="<pad>"
    )


def said(tokenizer: Any, tokens: list[int]) -> list[str]:
    pieces = TextPieces(tokenizer, skipped_ids(tokenizer))
    return [pieces.push(t) for t in tokens]


def test_pieces_of_a_word_join_and_a_pause_puts_a_space() -> None:
    words = said(sentencepiece_like(), [3, 4, 5, 6, 3, 0, 3, 4, 5])
    assert words == ["", "hel", "lo", " there", "", "", "", " hel", "lo"]
    assert "".join(words) == "hello there hello"


def test_the_toy_tokenizer_says_words_and_skips_padding() -> None:
    toy = toy_tokenizer(64)
    assert "".join(said(toy, [3, 4, 5, 0, 6, 3])) == "yes no maybe"
    assert len(toy.get_vocab()) == 64


async def test_the_toy_models_frames_carry_its_words() -> None:
    engine = MoshiDuplexEngine(tiny=True, rows=1, sampling=Sampling(greedy=False))
    await engine.start()
    try:
        session = engine.open("a")
        words: list[str] = []
        async with asyncio.timeout(20):
            async for frame in session.frames():
                words.append(frame.words)
                if sum(1 for w in words if w) >= 5:
                    break
        text = "".join(words)
        assert text.strip() and not any(t in text for t in ("<pad>", "<epad>"))
    finally:
        await engine.close()


@pytest.mark.parametrize("tokens", [[], [3, 3, 0]])
def test_nothing_said_is_no_words(tokens: list[int]) -> None:
    assert "".join(said(toy_tokenizer(64), tokens)) == ""
