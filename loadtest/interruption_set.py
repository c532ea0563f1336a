"""The interruption bench's evaluation set: sounds that start over an answer, labelled.

Each `Sound` is what a user's microphone picks up while the assistant answers, and whether
it should cut the answer:

* backchannels ("uh-huh", "yeah", "right", "okay", "mm-hmm", "I see"): keep;
* noise bursts, synthesised from seeded noise shaped in frequency and time (`noise_burst`):
  a door (low band, sharp attack, 250 ms decay), a clatter (broadband, four hits in
  400 ms), a hiss (high band, 600 ms flat): keep;
* coughs, synthesised (`cough`): a burst of noise shaped by three vowel-like resonances
  (500, 1500, 2500 Hz) with a 10 ms attack and a ~70 ms exponential decay, a 120 Hz glottal
  buzz under it, once or twice (a double cough 180 ms later, at two thirds of the level):
  keep;
* a second voice: another voice (espeak-ng's Scottish English or female variant) saying
  words unrelated to the call, 10 dB quieter than the user: keep;
* real interruptions ("wait, stop", "no, I meant Tuesday", "yeah but what about the
  price"): cut.

Speech is spoken by Piper's joe voice (`speech_set.piper_speaker`, its sampling noise off,
so the audio is fixed) and by espeak-ng voices (`speech.speak`), trimmed to its voiced part
and levelled to the same active loudness (`SPEECH_DBFS`). A `Case` places a sound at an
onset into the answer, with steady background noise (pink: white noise shaped 1/f in
frequency, seeded) at 10, 15 or 20 dB under the user's speech level for the whole session;
the second voice sits 10 dB under the user, so its own SNR is 0-10 dB. Everything is made at
run time and seeded: every run hears the same audio.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import soxr

from .speech import speak as espeak
from .speech import trim_silence

Pcm = npt.NDArray[np.int16]
Wave = npt.NDArray[np.float64]

RATE = 24_000
"""The Realtime WebSocket's default input format: PCM16 at 24 kHz."""
SPEECH_DBFS = -22.0
"""The active RMS level of the user's speech (the question, backchannels, interruptions)."""
SECOND_VOICE_DB = -10.0
"""The second voice's level against the user's."""
SNRS_DB = (10.0, 15.0, 20.0)
"""Background noise under the user's speech level."""
ONSETS_MS = (400, 1200, 2200, 3200)
"""When the sound starts, after the answer's first audio reached the client."""
SEED = 44

BACKCHANNELS = ("Uh-huh.", "Yeah.", "Right.", "Okay.", "Mm-hmm.", "I see.")
INTERRUPTIONS = ("Wait, stop.", "No, I meant Tuesday.", "Yeah, but what about the price?")
SECOND_VOICE_WORDS = (
    "The train to Glasgow leaves from platform nine at half past four.",
    "Add two cups of flour and stir until the batter is smooth.",
    "And in the north the afternoon will stay cloudy with light rain.",
)
ESPEAK_VOICES = {"espeak-us": "en-us", "espeak-gb": "en-gb", "espeak-f": "en-us+f3"}
"""The user's espeak-ng voices by the bench's name for them."""
SECOND_VOICES = ("en-gb-scotland", "en-us+f4")
VOICES = ("piper", *ESPEAK_VOICES)
KINDS = ("backchannel", "noise", "cough", "second_voice", "interruption")


@dataclass(frozen=True, slots=True)
class Sound:
    """A sound over the answer: mono PCM16 at RATE, starting on its first voiced sample."""

    kind: str
    """One of KINDS."""
    name: str
    """The words said, or which noise."""
    voice: str
    """Who said it (one of VOICES, an espeak-ng voice for a second voice), or "synth"."""
    pcm: Pcm
    interrupt: bool
    """Whether it should cut the answer."""

    @property
    def ms(self) -> float:
        return len(self.pcm) * 1000 / RATE


@dataclass(frozen=True, slots=True)
class Case:
    """One sound at one onset, in background noise at one SNR."""

    index: int
    sound: Sound
    onset_ms: int
    snr_db: float


def levelled(wave: Wave | Pcm, dbfs: float) -> Pcm:
    """`wave` scaled so its active RMS (over 20 ms windows within 30 dB of the loudest) is
    `dbfs`, as PCM16."""
    signal = np.asarray(wave, dtype=np.float64)
    window = RATE // 50
    usable = len(signal) // window * window
    rms = np.sqrt(np.mean(signal[:usable].reshape(-1, window) ** 2, axis=1) + 1e-12)
    active = rms[rms >= rms.max() * 10 ** (-30 / 20)]
    gain = 32768 * 10 ** (dbfs / 20) / float(np.sqrt(np.mean(active**2)))
    out: Pcm = np.clip(signal * gain, -32768, 32767).astype(np.int16)
    return out


def _shaped(noise: Wave, gain_of: Callable[[Wave], Wave]) -> Wave:
    """`noise` with its spectrum multiplied by `gain_of(frequencies in Hz)`."""
    spectrum = np.fft.rfft(noise)
    frequencies: Wave = np.fft.rfftfreq(len(noise), 1 / RATE).astype(np.float64)
    spectrum *= gain_of(frequencies)
    shaped: Wave = np.fft.irfft(spectrum, len(noise))
    return shaped


def pink_noise(samples: int, rng: np.random.Generator) -> Wave:
    """Unit-RMS pink noise: white noise with its amplitude spectrum shaped 1/sqrt(f) above
    50 Hz (equal power per octave, as a room's hum and traffic roughly are)."""

    def one_over_f(f: Wave) -> Wave:
        gain: Wave = 1 / np.sqrt(np.maximum(f, 50.0))
        return gain

    pink = _shaped(rng.normal(size=samples), one_over_f)
    unit: Wave = pink / float(np.sqrt(np.mean(pink**2)))
    return unit


def _band(low: float, high: float) -> Callable[[Wave], Wave]:
    """A band-pass gain with 1/4-octave raised-cosine skirts."""

    def gain(f: Wave) -> Wave:
        edge_lo, edge_hi = low * 2**-0.25, high * 2**0.25
        out = ((f >= low) & (f <= high)).astype(np.float64)
        rising = (f > edge_lo) & (f < low)
        out[rising] = 0.5 - 0.5 * np.cos(np.pi * (f[rising] - edge_lo) / (low - edge_lo))
        falling = (f > high) & (f < edge_hi)
        out[falling] = 0.5 + 0.5 * np.cos(np.pi * (f[falling] - high) / (edge_hi - high))
        return out

    return gain


def _ramps(wave: Wave, ms: float = 5.0) -> Wave:
    """`wave` with short linear fades at both ends (no click at its edges)."""
    n = min(len(wave) // 2, int(RATE * ms / 1000))
    ramp = np.linspace(0.0, 1.0, n)
    out = wave.copy()
    out[:n] *= ramp
    out[len(out) - n :] *= ramp[::-1]
    return out


def noise_burst(name: str, rng: np.random.Generator) -> Sound:
    """A door ("door"), a clatter ("clatter") or a hiss ("hiss"): see the module docstring."""
    t = np.arange(int(RATE * {"door": 0.25, "clatter": 0.4, "hiss": 0.6}[name])) / RATE
    if name == "door":
        wave = _shaped(rng.normal(size=len(t)), _band(60, 900)) * np.exp(-t / 0.06)
    elif name == "clatter":
        hits = sum(
            np.exp(-np.maximum(t - start, 0) / 0.025) * (t >= start)
            for start in (0.0, 0.09, 0.21, 0.3)
        )
        wave = _shaped(rng.normal(size=len(t)), _band(200, 8000)) * hits
    else:
        wave = _shaped(rng.normal(size=len(t)), _band(2000, 8000))
    return Sound("noise", name, "synth", levelled(_ramps(wave), SPEECH_DBFS), False)


def _one_cough(rng: np.random.Generator, ms: int = 300) -> Wave:
    t = np.arange(RATE * ms // 1000) / RATE
    formants = (500.0, 1500.0, 2500.0)

    def vocal_tract(f: Wave) -> Wave:
        bumps: Wave = np.full(len(f), 0.05)
        for centre in formants:
            bumps += np.exp(-(((f - centre) / (0.12 * centre + 80)) ** 2))
        return bumps

    breath = _shaped(rng.normal(size=len(t)), vocal_tract)
    breath /= float(np.sqrt(np.mean(breath**2)))
    buzz = _shaped(np.sign(np.sin(2 * np.pi * 120 * t)), vocal_tract)  # glottal pulses
    buzz /= float(np.sqrt(np.mean(buzz**2)))
    envelope = np.minimum(t / 0.01, 1.0) * np.exp(-t / 0.07)
    wave: Wave = (breath + 0.4 * buzz * np.exp(-t / 0.12)) * envelope
    return wave


def cough(double: bool, rng: np.random.Generator) -> Sound:
    """A cough, or two 180 ms apart (the second at two thirds of the level)."""
    first = _one_cough(rng)
    wave = first
    if double:
        gap = np.zeros(RATE * 180 // 1000 - len(first) // 2)
        wave = np.concatenate([first[: len(first) // 2], gap, _one_cough(rng) * 2 / 3])
    name = "double cough" if double else "cough"
    return Sound("cough", name, "synth", levelled(_ramps(wave), SPEECH_DBFS), False)


def speakers(voices: tuple[str, ...]) -> dict[str, Callable[[str], Pcm]]:
    """Text -> trimmed PCM16 at RATE, for each of `voices` (names in VOICES)."""
    out: dict[str, Callable[[str], Pcm]] = {}
    for voice in voices:
        if voice == "piper":
            from .speech_set import piper_speaker

            piper = piper_speaker()  # at 16 kHz

            def say_piper(text: str, piper: Callable[[str], Pcm] = piper) -> Pcm:
                wave = soxr.resample(piper(text), 16_000, RATE)
                return trim_silence(np.asarray(wave, dtype=np.int16))

            out[voice] = say_piper
        elif voice in ESPEAK_VOICES:

            def say_espeak(text: str, name: str = ESPEAK_VOICES[voice]) -> Pcm:
                return trim_silence(np.asarray(espeak(text, RATE, name)))

            out[voice] = say_espeak
        else:
            raise ValueError(f"voice {voice!r} is not one of {VOICES}")
    return out


def sounds(voices: tuple[str, ...] = VOICES, kinds: tuple[str, ...] = KINDS) -> list[Sound]:
    """Every sound of the set for `voices`, interleaved by kind so that a prefix of the list
    holds some of each."""
    say = speakers(voices)
    rng = np.random.default_rng(SEED)
    by_kind: dict[str, list[Sound]] = {kind: [] for kind in kinds}
    for text, voice in itertools.product(BACKCHANNELS, voices):
        if "backchannel" in kinds:
            pcm = levelled(say[voice](text), SPEECH_DBFS)
            by_kind["backchannel"].append(Sound("backchannel", text, voice, pcm, False))
    for text, voice in itertools.product(INTERRUPTIONS, voices):
        if "interruption" in kinds:
            pcm = levelled(say[voice](text), SPEECH_DBFS)
            by_kind["interruption"].append(Sound("interruption", text, voice, pcm, True))
    if "noise" in kinds:
        by_kind["noise"] = [noise_burst(name, rng) for name in ("door", "clatter", "hiss")]
    if "cough" in kinds:
        by_kind["cough"] = [cough(double, rng) for double in (False, True, False)]
    if "second_voice" in kinds:
        for i, text in enumerate(SECOND_VOICE_WORDS):
            voice = SECOND_VOICES[i % len(SECOND_VOICES)]
            pcm = trim_silence(np.asarray(espeak(text, RATE, voice)))
            level = SPEECH_DBFS + SECOND_VOICE_DB
            by_kind["second_voice"].append(
                Sound("second_voice", text, voice, levelled(pcm, level), False)
            )
    rounds = itertools.zip_longest(*by_kind.values())
    return [sound for row in rounds for sound in row if sound is not None]


def cases(all_sounds: list[Sound], n: int | None = None, reps: int = 1) -> list[Case]:
    """The first `n` sounds (all if None), each `reps` times, at onsets and SNRs taken in
    turn (so that every kind meets every onset and SNR over a large enough set)."""
    chosen = all_sounds if n is None else all_sounds[:n]
    out: list[Case] = []
    for rep in range(reps):
        for i, sound in enumerate(chosen):
            k = rep * len(chosen) + i
            onset = ONSETS_MS[(i + rep) % len(ONSETS_MS)]
            out.append(Case(k, sound, onset, SNRS_DB[(i // 2 + rep) % len(SNRS_DB)]))
    return out
