"""The judge of speech over an answer: a backchannel or a noise, or a real interruption.

With `turn_detection.interruption: "adaptive"` an answer that the user speaks over is held
silent (its audio paused, nothing lost) while this judges what was heard; overlap.py
gathers the evidence and applies the verdict. The judge is a pure function of an
`Overlap`, behind the `OverlapJudge` protocol, so that a learned model can take its place.

`BackchannelRules`, the judge sessions use, decides by these rules, in order:

0. The voice is more than `FAR_VOICE_DB` (6 dB) quieter than the user's own turns: a
   voice across the room (a second person, a television): **keep**, whatever its length
   and words (voice_level.py; not used before the user's first turn).
1. The voice has lasted longer than `MAX_BACKCHANNEL_MS` (700 ms): **interrupt**. A
   backchannel is short ("yeah" ~350 ms, "I see" ~400 ms, "mm-hmm" ~550 ms spoken by
   espeak-ng; people's are mostly 200-500 ms); speech this long is a turn, whatever its
   words, and is known for one without waiting for them.
2. The words are not known yet: **no verdict** (wait: for them, or for the deadline, which
   the caller keeps: `interruption_deadline_ms`, a real interruption when it passes).
3. No words once non-speech marks are removed (a cough, a door, a burst of noise, a click
   or a breath: the recogniser hears nothing, or "[cough]"): **keep**.
4. Nothing but backchannel words, at most `MAX_BACKCHANNEL_WORDS` of them ("uh-huh",
   "yeah", "right", "okay", "mm-hmm", "I see", "yeah, right", "oh okay"...; the list is
   `BACKCHANNELS`, fillers "uh", "um", "hmm" included): **keep**.
5. Anything else ("wait, stop", "no, I meant Tuesday", "yeah but what about the price",
   "stop"): **interrupt**.

Speech shorter than `min_speech_ms` is judged by its words like any other. Kept at once
for its length alone (as `always` treats it), "Wait, stop." in Piper's voice was kept
twice over in `loadtest.interruption_bench`: the detector heard it as 140 and 180 ms of
voice with a pause between, and each piece was shorter than the 200 ms.

A backchannel followed by more is judged again with the words so far (overlap.py holds the
answer again as soon as the voice comes back), so "yeah ... but what about the price"
interrupts at its second word however long the gap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from .voice_level import FAR_VOICE_DB


class Verdict(StrEnum):
    KEEP = "keep"
    """A backchannel or a noise: the answer goes on exactly where it was held."""
    INTERRUPT = "interrupt"
    """A real interruption: the answer is cut and truncated to what was heard."""


@dataclass(frozen=True, slots=True)
class Overlap:
    """What is known of the speech over an answer at one moment."""

    voiced_ms: int
    """From its first voiced frame to its last so far, gaps inside included (after a
    backchannel, from where the voice came back)."""
    stopped: bool
    """The voice has stopped (a pause after it, or its end)."""
    words: str | None
    """What the recogniser heard up to the pause; None: not (yet) recognised."""
    min_speech_ms: int
    """The session's `min_speech_ms` (what `always` needs to cut; BackchannelRules judges
    shorter speech by its words too)."""
    against_user_db: float | None = None
    """Its level less the user's turns' (voice_level.py); None: not known (yet)."""


class OverlapJudge(Protocol):
    def judge(self, overlap: Overlap) -> Verdict | None:
        """The verdict on `overlap`, or None while it cannot tell yet."""
        ...


MAX_BACKCHANNEL_MS = 700
MAX_BACKCHANNEL_WORDS = 4
BACKCHANNELS = frozenset(
    {
        "uh huh",
        "mm hmm",
        "mhm",
        "mmhmm",
        "mm",
        "mmm",
        "m",
        "mmi",
        "mm hm",
        "mhmm",
        "hmm",
        "hm",
        "uh",
        "um",
        "ah",
        "oh",
        "aha",
        "yeah",
        "yea",
        "yep",
        "yes",
        "right",
        "okay",
        "ok",
        "alright",
        "all right",
        "sure",
        "i see",
        "got it",
        "exactly",
        "true",
        "cool",
        "nice",
    }
)
"""Backchannels and fillers, normalised (lower case, words split on spaces and hyphens).
Whisper writes espeak-ng's "uh-huh" as "Uh uh" (two fillers), and "mm-hmm" as "MMI." or
"M-M-M." (`loadtest.interruption_bench` cut every "mm-hmm" before "m" and "mmi" were here).
"No" is not here: it disagrees, and is how most corrections start."""
_LONGEST = max(len(phrase.split()) for phrase in BACKCHANNELS)
_NON_SPEECH = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")
"""Recognisers' marks for what is not words: "[cough]", "(laughs)", "*sigh*"."""
_WORD = re.compile(r"[a-z']+")


def normalised_words(text: str) -> list[str]:
    """`text`'s words, lower case, without punctuation or non-speech marks."""
    return _WORD.findall(_NON_SPEECH.sub(" ", text.lower()).replace("-", " "))


def is_backchannel(words: list[str]) -> bool:
    """Whether `words` are backchannel phrases alone (at most MAX_BACKCHANNEL_WORDS)."""
    if not words or len(words) > MAX_BACKCHANNEL_WORDS:
        return False
    at = 0
    while at < len(words):
        for size in range(min(_LONGEST, len(words) - at), 0, -1):
            if " ".join(words[at : at + size]) in BACKCHANNELS:
                at += size
                break
        else:
            return False
    return True


class BackchannelRules:
    """The rules of the module docstring."""

    def judge(self, overlap: Overlap) -> Verdict | None:
        if overlap.against_user_db is not None and overlap.against_user_db < -FAR_VOICE_DB:
            return Verdict.KEEP
        if overlap.voiced_ms > MAX_BACKCHANNEL_MS:
            return Verdict.INTERRUPT
        if overlap.words is None:
            return None
        words = normalised_words(overlap.words)
        if not words or is_backchannel(words):
            return Verdict.KEEP
        return Verdict.INTERRUPT
