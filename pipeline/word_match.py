"""Whether two transcripts say the same words.

A quick recogniser's draft and the final recogniser's words often differ only in case and
punctuation ("what's the time" / "What's the time?"); an answer begun on the draft answers
the final words just as well then, and is kept. Any other difference, a word changed,
added or dropped, counts: the answer is begun again on the final words.
"""

from __future__ import annotations

import re

_NOT_WORD = re.compile(r"[^\w']+")


def words_of(text: str) -> list[str]:
    """`text`'s words, lower case, without punctuation (apostrophes inside words kept)."""
    return [word.strip("'") for word in _NOT_WORD.split(text.lower()) if word.strip("'")]


def same_words(a: str, b: str) -> bool:
    """Whether `a` and `b` are the same words, case and punctuation aside."""
    return words_of(a) == words_of(b)
