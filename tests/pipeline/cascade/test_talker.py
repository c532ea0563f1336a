"""The talker cuts the streamed reply into clauses and phonemizes each as soon as it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
from piper import PiperVoice

from pipeline.engines.cascade.talker import ClauseSplitter, TalkerEngine
from pipeline.types import Chunk, CodecCodes, End, PipelineRequest, StageInput, TextDelta


def request(**kwargs: object) -> PipelineRequest:
    return PipelineRequest(request_id="r1", audio=np.zeros(0, dtype=np.int16), **kwargs)  # type: ignore[arg-type]


def test_splitter_waits_for_what_follows_a_full_stop() -> None:
    splitter = ClauseSplitter(first_clause_words=0)  # punctuation alone
    assert splitter.feed("It is 3") == []
    assert splitter.feed(".") == []
    assert splitter.feed("5 degrees.") == []
    assert splitter.feed(' She said "go!" Then') == ["It is 3.5 degrees.", 'She said "go!"']
    long = " we walked along the winding road by the sea, and"
    assert splitter.feed(long) == ["Then we walked along the winding road by the sea,"]
    assert splitter.flush() == "and"


async def test_yields_phoneme_ids_per_clause_before_the_stream_ends(voice: PiperVoice) -> None:
    events: list[str] = []
    deltas = [
        TextDelta(text="what is the capital", kind="input_transcript"),
        TextDelta(text="The capital"),
        TextDelta(text=" of France is Paris."),
        TextDelta(text=" It is lovely"),
        TextDelta(text=" in spring"),
    ]

    async def upstream() -> AsyncIterator[Chunk]:
        for delta in deltas:
            events.append(f"sent {delta.text}")
            yield delta
        yield End()

    talker = TalkerEngine()
    await talker.start()
    chunks: list[Chunk] = []
    async for chunk in talker.generate("r1", StageInput(request(), upstream())):
        chunks.append(chunk)
        if isinstance(chunk, CodecCodes):
            events.append(f"codes {chunk.metadata['text']}")
    await talker.close()

    codes = [c for c in chunks if isinstance(c, CodecCodes)]
    # The first clause is cut after three words (FIRST_CLAUSE_WORDS), to be heard sooner.
    assert [c.metadata["text"] for c in codes] == [
        "The capital of",
        "France is Paris.",
        "It is lovely in spring",
    ]
    assert events.index("codes The capital of") < events.index("sent  in spring")
    for c in codes:
        assert c.codes.dtype == np.int32 and len(c.codes) > 10
        assert c.metadata["sample_rate"] == 22_050
    assert isinstance(chunks[-1], End)
    assert talker.active_requests() == 0


async def test_text_only_requests_get_no_speech(voice: PiperVoice) -> None:
    async def upstream() -> AsyncIterator[Chunk]:
        yield TextDelta(text="Hello there. How are you?")
        yield End()

    talker = TalkerEngine()
    await talker.start()
    chunks = [
        c
        async for c in talker.generate("r2", StageInput(request(output_text_only=True), upstream()))
    ]
    assert chunks == [End()]


def test_the_first_clause_is_cut_early_to_start_speaking_sooner() -> None:
    splitter = ClauseSplitter(first_clause_words=4)
    clauses: list[str] = []
    text = "Well I think that the answer is forty two. And that is all"
    for word in text.split():
        clauses += splitter.feed(word + " ")
    # The first clause stops at four words; later ones wait for punctuation.
    assert clauses == ["Well I think that", "the answer is forty two."]
    assert splitter.flush() == "And that is all"
    splitter = ClauseSplitter()
    assert splitter.feed("Sure, ") == ["Sure,"]  # any comma ends the first clause


def test_a_first_clause_ending_on_a_word_no_token_continues_goes_at_once() -> None:
    """ "of" is whole as it arrives: no need to wait for " France" to begin. A number or a
    content word may go on in the next token ("7" -> "70", "photos" -> "photosynthesis"),
    so those wait for it as before."""
    tokens = ["The", " capital", " of", " France", " is", " Paris", "."]
    splitter = ClauseSplitter()
    assert [splitter.feed(t) for t in tokens[:3]] == [[], [], ["The capital of"]]
    assert [splitter.feed(t) for t in tokens[3:]] == [[], [], [], []]
    assert splitter.flush() == "France is Paris."
    splitter = ClauseSplitter()
    assert [splitter.feed(t) for t in ["There", " are", " 7", " days"]] == [
        [],
        [],
        [],
        ["There are 7"],
    ]
    splitter = ClauseSplitter()
    assert [splitter.feed(t) for t in ["Plants", " use", " photos", "ynthesis", " to"]] == [
        [],
        [],
        [],
        [],
        ["Plants use photosynthesis"],
    ]
