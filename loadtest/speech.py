"""Real speech for tests and load tests, synthesised with espeak-ng at run time.

Turn detection has to be judged on speech, not on tones: a VAD tuned on sines passes its
tests and then clips the first consonant of every real sentence. espeak-ng is small,
deterministic and installed next to the test suite, so tests get real phonemes with edges
we know exactly (after trimming the synthesiser's own silence).

Synthesis takes tens of milliseconds a sentence, so results are cached per process.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import soxr

Pcm = npt.NDArray[np.int16]

TRIM_THRESHOLD = 200
"""Peak amplitude (PCM16) a short window must reach to count as speech when trimming.

About -44 dBFS: well under the quietest fricative espeak-ng makes, well over its silence
(exact zeros) and over the background noise `utterances_with_gaps` adds (~30).
"""
TRIM_WINDOW = 16
"""Samples per trimming window (1 ms at 16 kHz): finer than any tolerance tests check."""
NOISE_AMPLITUDE = 30


def speak(text: str, rate: int = 16_000, voice: str = "en-us") -> Pcm:
    """`text` spoken by espeak-ng as mono PCM16 at `rate` Hz (a read-only cached array)."""
    return _speak_cached(text, rate, voice)


@lru_cache(maxsize=256)
def _speak_cached(text: str, rate: int, voice: str) -> Pcm:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng is not installed: apt-get install espeak-ng")
    wav = subprocess.run(
        [exe, "-v", voice, "--stdout", text], check=True, capture_output=True, timeout=30
    ).stdout
    with wave.open(io.BytesIO(wav)) as reader:
        if reader.getsampwidth() != 2 or reader.getnchannels() != 1:
            raise RuntimeError("espeak-ng did not write mono PCM16")
        source_rate = reader.getframerate()
        # espeak-ng streams to stdout, so the header's frame count is a placeholder:
        # read to the end instead of trusting it.
        raw = reader.readframes(reader.getnframes())
    pcm = np.frombuffer(raw, dtype="<i2").astype(np.int16)
    if source_rate != rate:
        pcm = soxr.resample(pcm, source_rate, rate)
    pcm.setflags(write=False)
    return pcm


def trim_silence(pcm: Pcm, threshold: int = TRIM_THRESHOLD) -> Pcm:
    """`pcm` without the leading and trailing windows whose peak is below `threshold`.

    Works on 1 ms windows of 16 kHz audio, so the speech edges it leaves are known to
    within a millisecond. An all-silent input gives an empty array.
    """
    usable = len(pcm) // TRIM_WINDOW * TRIM_WINDOW
    peaks = np.abs(pcm[:usable].astype(np.int32)).reshape(-1, TRIM_WINDOW).max(axis=1)
    loud = np.flatnonzero(peaks >= threshold)
    if len(loud) == 0:
        return pcm[:0]
    return pcm[loud[0] * TRIM_WINDOW : (loud[-1] + 1) * TRIM_WINDOW]


def silence(ms: int, rate: int = 16_000) -> Pcm:
    return np.zeros(ms * rate // 1000, dtype=np.int16)


def utterances_with_gaps(
    texts: Sequence[str],
    gap_ms: int,
    lead_ms: int,
    rate: int = 16_000,
    noise: int = NOISE_AMPLITUDE,
    seed: int = 7,
) -> tuple[Pcm, list[tuple[int, int]]]:
    """`lead_ms` of silence, then each trimmed sentence followed by `gap_ms` of silence.

    Returns the signal and each sentence's (start_ms, end_ms) in it. Low seeded noise of
    peak about `noise` is added everywhere (0 for none) so silence is not digital zero,
    as it never is from a microphone. Edges are rounded to whole milliseconds.
    """
    parts: list[Pcm] = [silence(lead_ms, rate)]
    edges: list[tuple[int, int]] = []
    position = len(parts[0])
    for text in texts:
        speech = trim_silence(speak(text, rate))
        start = position
        position += len(speech)
        edges.append((round(start * 1000 / rate), round(position * 1000 / rate)))
        parts += [speech, silence(gap_ms, rate)]
        position += len(parts[-1])
    signal = np.concatenate(parts).astype(np.int32)
    if noise:
        rng = np.random.default_rng(seed)
        signal += rng.integers(-noise, noise + 1, size=len(signal))
    return np.clip(signal, -32768, 32767).astype(np.int16), edges
