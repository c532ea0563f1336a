"""Which part of an answer's text the user actually heard.

A streamed answer interleaves text and audio: each audio chunk speaks the text that came
before it and after the previous chunk. When playback stops at `played_ms`, the heard text
is everything spoken by fully played chunks, plus the share of the interrupted chunk's text
that matches its played share, cut back to a word boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpokenText:
    text: str = ""
    audio_ms: float = 0.0
    _marks: list[tuple[float, float, int, int]] = field(default_factory=list)
    """Per audio chunk: (start_ms, end_ms, text start, text end)."""
    _spoken_upto: int = 0

    def add_text(self, delta: str) -> None:
        self.text += delta

    def add_audio(self, duration_ms: float) -> None:
        start = self.audio_ms
        self.audio_ms += duration_ms
        self._marks.append((start, self.audio_ms, self._spoken_upto, len(self.text)))
        self._spoken_upto = len(self.text)

    def heard(self, played_ms: float) -> str:
        """The text heard when playback stopped after `played_ms` of this answer's audio."""
        if not self._marks:
            return ""
        if played_ms >= self.audio_ms:
            return self.text[: self._spoken_upto].strip()
        cut = 0
        for start, end, t0, t1 in self._marks:
            if played_ms >= end:
                cut = t1
                continue
            if played_ms > start:
                share = (played_ms - start) / (end - start)
                cut = t0 + int(share * (t1 - t0))
                if cut < t1:  # back off to the last whole word
                    space = self.text.rfind(" ", t0, cut + 1)
                    cut = space if space > t0 else t0
            break
        return self.text[:cut].strip()
