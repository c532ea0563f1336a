"""A fixed spoken set for judging speech recognisers: 30 voice-assistant questions, four ways.

Issue 12 found half of six plain questions misheard. To compare recognisers on more than an
anecdote, this module fixes 30 short questions and commands with their reference text, and
speaks them at run time (nothing is cached on disk): with the Piper joe voice (the cascade's
own, its sampling noise off so the audio is fixed), with espeak-ng (a harder, robotic voice),
and with the Piper audio under white noise and under babble (other sentences of the set,
mixed), both at 15 dB SNR and seeded, so every run hears exactly the same audio.

`normalise` makes word error rate fair between recognisers that write "10" and those that say
"ten": lower case, punctuation off, digits spelled out as words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import soxr

from loadtest.speech import speak as espeak
from pipeline.types import INPUT_SAMPLE_RATE

Pcm = npt.NDArray[np.int16]

SENTENCES = (
    "What is the capital of France?",
    "How many days are in a week?",
    "Set a timer for ten minutes.",
    "What time is it in Tokyo?",
    "Tell me a joke about cats.",
    "What is the weather like today?",
    "How far is the moon from the earth?",
    "Play some relaxing music.",
    "Who wrote the play Romeo and Juliet?",
    "What is the boiling point of water?",
    "Remind me to call my mother tomorrow.",
    "How do I make a cup of tea?",
    "What is two plus two?",
    "Turn off the lights in the kitchen.",
    "Spell the word necessary.",
    "How tall is the Eiffel Tower?",
    "What is the largest ocean in the world?",
    "Translate good morning into Spanish.",
    "Wake me up at seven in the morning.",
    "What should I cook for dinner tonight?",
    "How many legs does a spider have?",
    "Can you recommend a good book?",
    "What is the speed of light?",
    "Add milk and bread to my shopping list.",
    "Why is the sky blue?",
    "What year did the first man land on the moon?",
    "Send a message to Anna saying I am running late.",
    "How long should I boil an egg?",
    "What is the square root of sixty four?",
    "Give me three tips for better sleep.",
)
SNR_DB = 15.0
SEED = 12
VOICE_SETS = ("piper", "espeak", "piper+white", "piper+babble")


@dataclass(frozen=True)
class Utterance:
    reference: str
    audio: Pcm
    """Mono PCM16 at INPUT_SAMPLE_RATE."""


_ONES: tuple[str, ...] = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
)  # fmt: skip
_TENS: tuple[str, ...] = (
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
)  # fmt: skip


def number_words(n: int) -> str:
    """0 <= n < 1,000,000 in words, without "and": 64 -> "sixty four"."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = "" if n % 100 == 0 else " " + number_words(n % 100)
        return _ONES[n // 100] + " hundred" + rest
    rest = "" if n % 1000 == 0 else " " + number_words(n % 1000)
    return number_words(n // 1000) + " thousand" + rest


def normalise(text: str) -> list[str]:
    """Words for WER: lower case, digits as words, hyphens as spaces, other punctuation off."""
    text = text.lower().replace("-", " ").replace(",", "")
    text = re.sub(r"\d+", lambda m: f" {number_words(int(m.group()))} ", text)
    text = re.sub(r"[^a-z' ]", " ", text).replace("'", "")
    return text.split()


def word_errors(reference: str, heard: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words), after `normalise`."""
    ref, hyp = normalise(reference), normalise(heard)
    row = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, other in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (word != other))
    return row[-1], len(ref)


def piper_speaker() -> Callable[[str], Pcm]:
    """Text -> PCM16 at INPUT_SAMPLE_RATE, spoken by the cascade's default Piper voice.

    Piper samples its prosody and durations from noise drawn inside the ONNX graph, which
    nothing outside can seed: left on, two runs of the same set differed by 3 points of WER.
    The set turns that noise off (noise scales 0), so each sentence is always the same audio."""
    from piper import SynthesisConfig

    from pipeline.engines.cascade.voice import clause_phoneme_ids, load_voice

    voice = load_voice()
    fixed = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)

    def say(text: str) -> Pcm:
        ids = [int(i) for i in clause_phoneme_ids(voice, text)]
        audio = np.asarray(voice.phoneme_ids_to_audio(ids, fixed), dtype=np.float32).reshape(-1)
        audio = audio / max(0.01, float(np.abs(audio).max()))
        rate = voice.config.sample_rate
        resampled = np.asarray(soxr.resample(audio, rate, INPUT_SAMPLE_RATE), dtype=np.float32)
        return (np.clip(resampled, -1, 1) * 32767).astype(np.int16)

    return say


def _mix(speech: Pcm, noise: npt.NDArray[np.float64], snr_db: float) -> Pcm:
    """`speech` plus `noise` scaled so speech power / noise power is `snr_db`."""
    signal = speech.astype(np.float64)
    noise = noise[: len(signal)]
    gain = np.sqrt(np.mean(signal**2) / (np.mean(noise**2) * 10 ** (snr_db / 10)))
    mixed: Pcm = np.clip(signal + gain * noise, -32768, 32767).astype(np.int16)
    return mixed


def _babble(others: list[Pcm], length: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Up to four other sentences, each looped to `length` from a random offset, summed."""
    mixed = rng.normal(0.0, 1.0, length) * 1e-3
    for index in rng.choice(len(others), size=min(4, len(others)), replace=False):
        source = others[index].astype(np.float64)
        looped = np.tile(source, length // len(source) + 2)
        start = int(rng.integers(0, len(source)))
        mixed += looped[start : start + length]
    return mixed


def spoken_set(
    voice_set: str, sentences: tuple[str, ...] = SENTENCES, snr_db: float = SNR_DB
) -> Iterator[Utterance]:
    """Each sentence of `sentences` spoken as `voice_set` says (one of VOICE_SETS), the
    noisy sets at `snr_db` (15 dB unless asked: the noise reduction bench asks for 5 too)."""
    if voice_set not in VOICE_SETS:
        raise ValueError(f"voice set {voice_set!r} is not one of {VOICE_SETS}")
    if voice_set == "espeak":
        for text in sentences:
            yield Utterance(text, np.asarray(espeak(text, INPUT_SAMPLE_RATE)))
        return
    say = piper_speaker()
    clean = [say(text) for text in sentences]
    rng = np.random.default_rng(SEED)
    for index, (text, audio) in enumerate(zip(sentences, clean, strict=True)):
        if voice_set == "piper":
            yield Utterance(text, audio)
        elif voice_set == "piper+white":
            yield Utterance(text, _mix(audio, rng.normal(0.0, 1.0, len(audio)), snr_db))
        else:
            others = clean[:index] + clean[index + 1 :]
            yield Utterance(text, _mix(audio, _babble(others, len(audio), rng), snr_db))


def noise_only(kind: str, clean: list[Pcm], seconds: float, snr_db: float, seed: int = SEED) -> Pcm:
    """`seconds` of white or babble noise (`kind`) alone, at the level it has `snr_db`
    under the mean power of `clean` (the spoken set): what a microphone hears in that noise
    while nobody speaks to it."""
    rng = np.random.default_rng(seed)
    length = int(seconds * INPUT_SAMPLE_RATE)
    noise = rng.normal(0.0, 1.0, length) if kind == "white" else _babble(clean, length, rng)
    power = float(np.mean([np.mean(c.astype(np.float64) ** 2) for c in clean]))
    gain = np.sqrt(power / (np.mean(noise**2) * 10 ** (snr_db / 10)))
    out: Pcm = np.clip(gain * noise, -32768, 32767).astype(np.int16)
    return out
