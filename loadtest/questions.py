"""The spoken question set of the voice benchmark, and how its answers are scored.

Each question has a factual answer that a correct reply cannot give without one of its key
words ("What is the capital of France?" -> "paris"), so the Thinker's quality is a count
rather than a judgement. The questions are plain, short and spoken by Piper, so the
recogniser's word error rate on them is a floor for what users will see.

Scoring:
- `word_error_rate`: word-level edit distance over reference words, summed over the set
  (a corpus WER, as recognisers are compared), after `normalise` on both sides.
- `hits`: whether an answer names one of its question's key words, as whole words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    keywords: frozenset[str]
    """Normalised words or phrases; a correct answer contains at least one."""


def _q(text: str, *keywords: str) -> Question:
    return Question(text, frozenset(keywords))


QUESTIONS: tuple[Question, ...] = (
    _q("What is the capital of France?", "paris"),
    _q("How many days are there in a week?", "seven", "7"),
    _q("What colour is the sky on a clear day?", "blue"),
    _q("What is the tallest mountain in the world?", "everest"),
    _q("How many legs does a spider have?", "eight", "8"),
    _q("What is the largest planet in our solar system?", "jupiter"),
    _q("Who wrote Romeo and Juliet?", "shakespeare"),
    _q("What is the capital of Japan?", "tokyo"),
    _q("What colour is a ripe banana?", "yellow"),
    _q("How many hours are there in a day?", "twenty four", "24"),
    _q("What do we call frozen water?", "ice"),
    _q("Which planet is known as the red planet?", "mars"),
    _q("Which farm animal gives us milk?", "cow", "cows", "goat", "goats"),
    _q("What is the largest ocean on Earth?", "pacific"),
    _q("What is the opposite of hot?", "cold"),
    _q("What sweet food do bees make?", "honey"),
    _q("In which country are the pyramids of Giza?", "egypt"),
    _q("What gas do plants take in from the air?", "carbon dioxide", "co2"),
    _q("How many minutes are there in an hour?", "sixty", "60"),
    _q("What is the freezing point of water in Celsius?", "zero", "0"),
)


def normalise(text: str) -> str:
    """Lower case, words and digits only, single spaces ("Twenty-four." -> "twenty four")."""
    return " ".join(re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower().replace("-", " ")))


def hits(answer: str, keywords: Iterable[str]) -> bool:
    """Whether the normalised answer holds one of `keywords` as whole words."""
    padded = f" {normalise(answer)} "
    return any(f" {keyword} " in padded for keyword in keywords)


def word_edits(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance over words: substitutions + deletions + insertions."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


def word_error_rate(pairs: Iterable[tuple[str, str]]) -> float:
    """Corpus WER of (reference, hypothesis) pairs: all edits over all reference words."""
    edits = words = 0
    for reference, hypothesis in pairs:
        ref, hyp = normalise(reference).split(), normalise(hypothesis).split()
        edits += word_edits(ref, hyp)
        words += len(ref)
    return edits / words if words else 0.0
