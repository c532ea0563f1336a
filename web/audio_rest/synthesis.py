"""Text to speech with the pipeline's Piper voice, a sentence at a time, as 24 kHz PCM16.

The text is cut into sentences (and a sentence longer than MAX_PIECE_CHARS at its commas or
spaces), so the first audio goes out after one sentence's synthesis, not the whole input's.
Each piece is phonemized on the event loop (espeak-ng, a few milliseconds, and not safe to
call from two threads at once: the Talker phonemizes on the loop too) and rendered by the
voice's ONNX model on a worker thread; a client that goes away stops the work at the next
piece. Like Piper's own `synthesize`, each piece is normalised to full scale.

OpenAI's speech API speaks at 24 kHz (its `pcm` is 24 kHz mono PCM16), so the voice's own
rate (22.05 kHz for joe) is resampled once for the whole answer by one soxr stream: no
clicks where pieces meet. `speed` (OpenAI's 0.25-4.0) divides Piper's `length_scale`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import soxr

from pipeline.engines.cascade.voice import clause_phoneme_ids

from .blocking import off_loop

if TYPE_CHECKING:
    from piper import PiperVoice

OUTPUT_RATE = 24_000
MAX_PIECE_CHARS = 240
"""A piece longer than this is cut at a comma or a space: Piper's cost and its first audio
grow with the piece's length."""
SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")

Pcm = npt.NDArray[np.int16]


def pieces(text: str) -> list[str]:
    """`text` cut into sentences, each at most MAX_PIECE_CHARS long where it can be cut."""
    out: list[str] = []
    for sentence in SENTENCE_END.split(text):
        sentence = sentence.strip()
        while len(sentence) > MAX_PIECE_CHARS:
            cut = max(
                sentence.rfind(", ", 0, MAX_PIECE_CHARS), sentence.rfind(" ", 0, MAX_PIECE_CHARS)
            )
            cut = cut if cut > 0 else MAX_PIECE_CHARS
            out.append(sentence[: cut + 1].strip())
            sentence = sentence[cut + 1 :].strip()
        if sentence:
            out.append(sentence)
    return out


def _render(voice: PiperVoice, ids: list[int], length_scale: float) -> npt.NDArray[np.float32]:
    """Worker thread: one piece through the voice's model, normalised to full scale."""
    from piper import SynthesisConfig

    audio = voice.phoneme_ids_to_audio(ids, SynthesisConfig(length_scale=length_scale))
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    peak = float(np.abs(samples).max()) if len(samples) else 0.0
    return samples / peak if peak > 1e-8 else np.zeros_like(samples)


async def speak(voice: PiperVoice, text: str, speed: float = 1.0) -> AsyncGenerator[Pcm, None]:
    """`text` spoken by `voice` at `speed`, as 24 kHz mono PCM16 pieces."""
    length_scale = float(voice.config.length_scale) / speed
    resampler = soxr.ResampleStream(voice.config.sample_rate, OUTPUT_RATE, 1, dtype="float32")
    for piece in pieces(text):
        ids = [int(i) for i in clause_phoneme_ids(voice, piece)]
        if not ids:
            continue
        audio = await off_loop(_render, voice, ids, length_scale)
        yield _pcm16(resampler.resample_chunk(audio))
    yield _pcm16(resampler.resample_chunk(np.zeros(0, np.float32), last=True))


def _pcm16(audio: npt.NDArray[np.float32]) -> Pcm:
    return (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
