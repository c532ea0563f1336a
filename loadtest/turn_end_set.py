"""The spoken turns of the end-of-turn benchmark (issue 12): whole questions and broken ones.

A semantic end of turn is only worth having if it ends whole questions sooner without cutting
in on a speaker who hesitates mid-sentence. So each of the 30 questions of `speech_set` is
spoken three ways by the cascade's Piper voice: straight through, and broken by a silent
pause of 400, 700 or 1000 ms at two fixed points, after a function word ("What is the
capital of | France") and, harder for a judge of the words, after a content word ("Set a
timer | for ten minutes"), where the words so far could be a whole request.

Each part is spoken on its own, trimmed to its voice, and joined by exactly the pause: the
first part then ends as a whole sentence would, its pitch falling ("What is the capital
of."), as if the speaker had finished and then thought of more. With `cut` (`piper_cutter`,
`turn_end_bench --breaks cut`) the first part is instead the whole sentence's audio cut at the
word where it breaks (Piper's phoneme alignment), so it ends mid-sentence in sound as well as
in words, as a speaker who hesitates does: what an audio judge (Smart Turn) hears. The
turn sits in low microphone noise (about -60 dBFS, seeded per turn), with lead-in for the
detector's noise floor and enough trailing silence for the longest window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import soxr

from loadtest.speech_set import SENTENCES, Pcm
from pipeline.types import INPUT_SAMPLE_RATE

PAUSES_MS = (400, 700, 1000)
LEAD_MS = 600
TAIL_MS = 3_200
NOISE_RMS = 30.0
"""Microphone noise, in LSB: about -60 dBFS."""
VOICE_DBFS = -50.0
"""A 10 ms window at least this loud is voice (where a part's edges are trimmed)."""
SEED = 12

BREAKS: dict[str, tuple[str, str]] = {
    "What is the capital of France?": ("of", "capital"),
    "How many days are in a week?": ("a", "days"),
    "Set a timer for ten minutes.": ("for", "timer"),
    "What time is it in Tokyo?": ("in", "time"),
    "Tell me a joke about cats.": ("about", "joke"),
    "What is the weather like today?": ("the", "weather"),
    "How far is the moon from the earth?": ("the#2", "moon"),
    "Play some relaxing music.": ("some", "relaxing"),
    "Who wrote the play Romeo and Juliet?": ("and", "play"),
    "What is the boiling point of water?": ("of", "point"),
    "Remind me to call my mother tomorrow.": ("my", "mother"),
    "How do I make a cup of tea?": ("of", "make"),
    "What is two plus two?": ("plus", "two"),
    "Turn off the lights in the kitchen.": ("the#2", "lights"),
    "Spell the word necessary.": ("the", "word"),
    "How tall is the Eiffel Tower?": ("the", "tall"),
    "What is the largest ocean in the world?": ("the#2", "ocean"),
    "Translate good morning into Spanish.": ("into", "morning"),
    "Wake me up at seven in the morning.": ("at", "seven"),
    "What should I cook for dinner tonight?": ("for", "cook"),
    "How many legs does a spider have?": ("a", "legs"),
    "Can you recommend a good book?": ("a", "recommend"),
    "What is the speed of light?": ("of", "speed"),
    "Add milk and bread to my shopping list.": ("my", "bread"),
    "Why is the sky blue?": ("the", "sky"),
    "What year did the first man land on the moon?": ("the#2", "land"),
    "Send a message to Anna saying I am running late.": ("to", "message"),
    "How long should I boil an egg?": ("an", "boil"),
    "What is the square root of sixty four?": ("of", "root"),
    "Give me three tips for better sleep.": ("for", "tips"),
}
"""Where each question breaks: after this function word, and after this content word
("the#2": the second "the")."""


@dataclass(frozen=True)
class Turn:
    name: str
    sentence: int
    """Its index in SENTENCES."""
    kind: str
    """"whole", "function" (broken after a function word) or "content"."""
    pause_ms: int
    audio: Pcm
    voice_end_ms: int
    """Where the last voiced sample is."""
    resume_ms: int | None
    """A broken turn: where the voice comes back after the pause."""


def split(sentence: str, word: str) -> tuple[str, str]:
    """`sentence` broken after `word` ("word#2": its second occurrence)."""
    target, _, nth = word.partition("#")
    words = sentence.split()
    seen = 0
    for index, spoken in enumerate(words):
        if spoken.strip("?.,").lower() == target:
            seen += 1
            if seen == int(nth or 1):
                return " ".join(words[: index + 1]), " ".join(words[index + 1 :])
    raise ValueError(f"{word!r} is not in {sentence!r}")


def trimmed(audio: Pcm) -> Pcm:
    """`audio` from its first voiced 10 ms to its last."""
    step = INPUT_SAMPLE_RATE // 100
    windows = audio[: len(audio) // step * step].astype(np.float64).reshape(-1, step)
    level = 20 * np.log10(np.maximum(np.sqrt(np.mean(windows**2, axis=1)), 1.0) / 32768)
    voiced = np.flatnonzero(level >= VOICE_DBFS)
    return audio[voiced[0] * step : (voiced[-1] + 1) * step]


def _turn(name: str, kind: str, parts: list[Pcm], pause_ms: int, sentence: int) -> Turn:
    """The parts joined by `pause_ms` in noise, seeded by sentence and kind: every pause
    has the same noise up to the pause (so the words before it are heard the same way)."""
    seed = sentence * 3 + ("whole", "function", "content").index(kind)
    gap = np.zeros(pause_ms * INPUT_SAMPLE_RATE // 1000, dtype=np.int16)
    voice = parts[0] if len(parts) == 1 else np.concatenate([parts[0], gap, parts[1]])
    lead = LEAD_MS * INPUT_SAMPLE_RATE // 1000
    audio = np.concatenate(
        [np.zeros(lead), voice, np.zeros(TAIL_MS * INPUT_SAMPLE_RATE // 1000)]
    ).astype(np.float64)
    audio += np.random.default_rng([SEED, seed]).normal(0.0, NOISE_RMS, len(audio))
    pcm: Pcm = np.clip(audio, -32768, 32767).astype(np.int16)
    end_ms = (lead + len(voice)) * 1000 // INPUT_SAMPLE_RATE
    resume_ms = None if len(parts) == 1 else end_ms - len(parts[1]) * 1000 // INPUT_SAMPLE_RATE
    return Turn(name, sentence, kind, pause_ms, pcm, end_ms, resume_ms)


Cutter = Callable[[str, int], tuple[Pcm, Pcm]]
"""(sentence, n) -> the sentence spoken whole, cut after its n-th word."""


def piper_cutter() -> Cutter:
    """`Cutter` with the cascade's Piper voice (its prosody noise off, as `piper_speaker`):
    the cut is where the phoneme alignment puts the end of the n words' phonemes (as far as
    they are the whole sentence's: espeak-ng may join words)."""
    from piper import SynthesisConfig

    from pipeline.engines.cascade.voice import clause_phoneme_ids, load_voice

    voice = load_voice()
    fixed = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    rate = voice.config.sample_rate

    def cut(sentence: str, n: int) -> tuple[Pcm, Pcm]:
        whole = [p for part in voice.phonemize(sentence) for p in part]
        first = [p for part in voice.phonemize(" ".join(sentence.split()[:n])) for p in part]
        shared = next(
            (i for i, (a, b) in enumerate(zip(whole, first, strict=False)) if a != b),
            len(first),
        )
        ids = [int(i) for i in clause_phoneme_ids(voice, sentence)]
        spoken = voice.phoneme_ids_to_audio(ids, fixed, include_alignments=True)
        assert isinstance(spoken, tuple), "the voice is loaded with alignments"
        audio, samples = spoken
        # ids: "^", pad, then each phoneme and a pad: the first `shared` phonemes are 2 + 2k
        at = int(np.sum(np.asarray(samples)[: 2 + 2 * shared]))
        wave = np.asarray(audio, dtype=np.float32).reshape(-1)
        wave = wave / max(0.01, float(np.abs(wave).max()))
        halves = []
        for half in (wave[:at], wave[at:]):
            resampled = np.asarray(soxr.resample(half, rate, INPUT_SAMPLE_RATE), np.float32)
            halves.append((np.clip(resampled, -1, 1) * 32767).astype(np.int16))
        return halves[0], halves[1]

    return cut


def turns(
    say: Callable[[str], Pcm],
    sentences: tuple[str, ...] = SENTENCES,
    pauses_ms: tuple[int, ...] = PAUSES_MS,
    kinds: tuple[str, ...] = ("whole", "function", "content"),
    cut: Cutter | None = None,
) -> list[Turn]:
    """The benchmark's turns for `sentences`, spoken by `say` (`piper_speaker()`), the
    broken ones cut from the whole sentence by `cut` if given."""
    out: list[Turn] = []
    for sentence in sentences:
        index = SENTENCES.index(sentence)
        if "whole" in kinds:
            out.append(_turn(sentence, "whole", [trimmed(say(sentence))], 0, index))
        for kind, word in zip(("function", "content"), BREAKS[sentence], strict=True):
            if kind not in kinds:
                continue
            first, rest = split(sentence, word)
            if cut is None:
                parts = [trimmed(say(first)), trimmed(say(rest))]
            else:
                parts = [trimmed(part) for part in cut(sentence, len(first.split()))]
            for pause in pauses_ms:
                out.append(_turn(f"{first} | {rest}", kind, parts, pause, index))
    return out
