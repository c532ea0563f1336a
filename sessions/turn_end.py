"""Does what the user said so far sound finished? The words' half of semantic_vad.

OpenAI's semantic_vad ends a turn when a model judges the user is done, so a complete
question is answered sooner and a sentence broken off at "and" or "the" is waited out.
Parley judges the words recognised at the turn's pause (turn_transcript.py) by their last
word: a sentence does not end on a conjunction, an article, a possessive, a preposition,
a filler, an operator ("two plus") or a contraction like "it's", and anything else sounds
finished. It is a rule, not a model: a sentence broken off after a verb or a noun ("I would
like", "set a timer") sounds finished to it, and a question ending in a preposition ("what
is it made of") does not. The words that end it were chosen to leave whole questions alone
("what is that", "how are you", "what should I do", "can I have some").

`python -m loadtest.turn_end_bench` measures it on spoken whole and broken questions: most
misses there are Whisper's, which hears a fragment as a whole phrase ("What is the" ->
"What is that?"), and a rule on the words cannot see them.
"""

from __future__ import annotations

import re

UNFINISHED_ENDINGS = frozenset(
    {
        "and",
        "or",
        "but",
        "so",
        "because",
        "if",
        "though",
        "although",
        "while",
        "whereas",
        "unless",
        "than",
        "the",
        "a",
        "an",
        "my",
        "your",
        "his",
        "her",
        "our",
        "their",
        "its",
        "every",
        "plus",
        "minus",
        "to",
        "of",
        "in",
        "on",
        "at",
        "for",
        "with",
        "from",
        "by",
        "about",
        "into",
        "onto",
        "between",
        "through",
        "during",
        "without",
        "um",
        "uh",
        "er",
        "erm",
        "hmm",
        "i'm",
        "you're",
        "we're",
        "they're",
        "it's",
    }
)
"""Last words after which a speaker has more to say."""

_WORD = re.compile(r"[a-z0-9']+")
"""Digits are a word: Whisper writes "the square root of 64?", which ends on 64, not "of"."""


def sounds_finished(transcript: str) -> bool | None:
    """True if `transcript` sounds like a whole turn, False if it breaks off, None when
    there are no words to judge (leave the end to the silence)."""
    words = _WORD.findall(transcript.lower())
    if not words:
        return None
    return words[-1] not in UNFINISHED_ENDINGS
