"""Whisper over an uploaded file, a segment at a time, each decoded on a worker thread.

faster-whisper's `transcribe` detects the language (when none is given), cuts the audio in
30 s windows and decodes them lazily: its segments come from a generator. Each step of that
generator runs off the event loop here, so a streamed transcription sends a segment's words
as soon as Whisper has them, and a client that goes away stops the work at the next
segment (the model boundary: nothing of the request is left running after it).

Settings, as OpenAI's parameters map to them: `language` (ISO-639-1) is Whisper's language;
`prompt` its initial prompt; `temperature` 0 (OpenAI's default) is Whisper's fallback ladder,
which raises the temperature only where a greedy decode fails its log-probability and
compression checks, as OpenAI describes; any other value is that one temperature.
Decoding is greedy (beam 1) and does not condition on the previous window's text, as the
sessions' recogniser: on a CPU both make it several times faster, and conditioning is what
makes Whisper repeat itself over long files.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from .blocking import off_loop
from .decode import Samples
from .errors import invalid

FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True, slots=True)
class ListenOptions:
    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    words: bool = False
    """Word timestamps (`timestamp_granularities[]=word`)."""


@dataclass(frozen=True, slots=True)
class Word:
    word: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Segment:
    """One of Whisper's segments, with the fields OpenAI's verbose_json gives."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()


@dataclass(frozen=True, slots=True)
class AudioInfo:
    language: str
    """ISO-639-1, as Whisper detected it or was told."""
    duration: float


class Recognition:
    """One file's transcription: `start()` (the language, the duration), then its segments."""

    def __init__(self, model: Any, samples: Samples, options: ListenOptions) -> None:
        self._model = model
        self._samples = samples
        self._options = options
        self._segments: Iterator[Any] | None = None

    async def start(self) -> AudioInfo:
        """Begin (the language detection runs here); AudioApiError(400) for a language
        Whisper does not know."""
        options = self._options
        temperatures = (
            [options.temperature] if options.temperature > 0 else list(FALLBACK_TEMPERATURES)
        )
        call = functools.partial(
            self._model.transcribe,
            self._samples,
            language=options.language,
            initial_prompt=options.prompt or None,
            temperature=temperatures,
            beam_size=1,
            condition_on_previous_text=False,
            word_timestamps=options.words,
        )
        try:
            segments, info = await off_loop(call)
        except ValueError as exc:  # an unknown language code
            raise invalid(f"language: {exc}", "language") from None
        self._segments = iter(segments)
        return AudioInfo(str(info.language), float(info.duration))

    async def segments(self) -> AsyncIterator[Segment]:
        """The segments as Whisper decodes them."""
        if self._segments is None:
            raise RuntimeError("start() the recognition first")
        source = self._segments
        while (found := await off_loop(next, source, None)) is not None:
            yield _segment(found)

    def close(self) -> None:
        """Stop decoding (the generator is idle between segments, so this is immediate)."""
        if self._segments is not None and hasattr(self._segments, "close"):
            self._segments.close()


def _segment(found: Any) -> Segment:
    words = tuple(Word(w.word, float(w.start), float(w.end)) for w in found.words or ())
    return Segment(
        id=int(found.id) - 1,  # faster-whisper counts from 1, OpenAI from 0
        seek=int(found.seek),
        start=float(found.start),
        end=float(found.end),
        text=str(found.text),
        tokens=tuple(int(t) for t in found.tokens),
        temperature=float(found.temperature or 0.0),
        avg_logprob=float(found.avg_logprob),
        compression_ratio=float(found.compression_ratio),
        no_speech_prob=float(found.no_speech_prob),
        words=words,
    )
