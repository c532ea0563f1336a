"""Which part of an answer's text the user actually heard.

A streamed answer interleaves text and audio. Each run of text is spoken by the audio
that follows it, up to the audio of the next run of text: a clause-by-clause engine gives
many short segments, an engine that sends all text first gives one long one. When playback
stops at `played_ms`, the heard text is that of the fully played segments plus the share of
the interrupted segment's text matching its played share, cut back to a whole word.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Segment:
    text_start: int
    text_end: int
    audio_start: float
    audio_end: float


@dataclass
class SpokenText:
    text: str = ""
    audio_ms: float = 0.0
    _segments: list[_Segment] = field(default_factory=list)
    _voiced_upto: int = 0
    """Length of the text that some audio has started to speak."""

    def add_text(self, delta: str) -> None:
        self.text += delta

    def add_audio(self, duration_ms: float) -> None:
        start = self.audio_ms
        self.audio_ms += duration_ms
        if len(self.text) > self._voiced_upto or not self._segments:
            self._segments.append(_Segment(self._voiced_upto, len(self.text), start, self.audio_ms))
            self._voiced_upto = len(self.text)
        else:
            self._segments[-1].audio_end = self.audio_ms

    def heard(self, played_ms: float) -> str:
        """The text heard when playback stopped after `played_ms` of this answer's audio."""
        cut = 0
        for seg in self._segments:
            if played_ms >= seg.audio_end:
                cut = seg.text_end
                continue
            if played_ms > seg.audio_start:
                share = (played_ms - seg.audio_start) / (seg.audio_end - seg.audio_start)
                cut = seg.text_start + int(share * (seg.text_end - seg.text_start))
                space = self.text.rfind(" ", seg.text_start, cut + 1)
                cut = space if space > seg.text_start else seg.text_start
            break
        return self.text[:cut].strip()
