"""The voice benchmark's measurements: one record per spoken turn, and the figures over a run.

Times are seconds on the client's monotonic clock. A step that never came (the echo pipeline
has no recogniser, so no input transcript) is None and is left out of the intervals that
need it; the count of turns that have each step says how many values an interval is over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .questions import Question, hits, word_error_rate

STEPS = ("speech_stopped", "transcribed", "first_text", "first_audio")
"""The events of a turn in the order a user waits for them."""
INTERVALS: tuple[tuple[str, str], ...] = (
    *(("last_voiced", step) for step in STEPS),
    ("speech_stopped", "transcribed"),
    ("transcribed", "first_text"),
    ("first_text", "first_audio"),
    ("speech_stopped", "first_audio"),
)


@dataclass
class Turn:
    question: Question
    last_voiced: float
    """The capture time of the question's last voiced sample."""
    speech_stopped: float | None = None
    transcribed: float | None = None
    first_text: float | None = None
    first_audio: float | None = None
    transcripts: list[str] = field(default_factory=list)
    """The input transcripts of the turn (more than one if turn detection split it)."""
    answers: list[str] = field(default_factory=list)
    """The transcripts of the answers' audio."""
    audio_s: float = 0.0
    early_stops: int = 0
    """speech_stopped events before the question was over."""
    mic_lag_s: float = 0.0
    """The latest a microphone chunk left after its capture time, up to this turn's end."""

    def at(self, step: str) -> float | None:
        value: float | None = getattr(self, step)
        return value

    def interval_ms(self, start: str, end: str) -> float | None:
        a, b = self.at(start), self.at(end)
        return None if a is None or b is None else (b - a) * 1000

    def record(self) -> dict[str, Any]:
        return {
            "question": self.question.text,
            "transcript": " ".join(self.transcripts),
            "answer": " ".join(self.answers),
            "hit": hits(" ".join(self.answers), self.question.keywords),
            "early_stops": self.early_stops,
            "audio_s": round(self.audio_s, 2),
            **{f"{step}_ms": _round(self.interval_ms("last_voiced", step)) for step in STEPS},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def figures(turns: list[Turn]) -> dict[str, Any]:
    """p50/p95 of every interval, WER, key-word hit rate, and each turn's record."""
    out: dict[str, Any] = {"turns": len(turns)}
    for start, end in INTERVALS:
        values = [v for t in turns if (v := t.interval_ms(start, end)) is not None]
        name = f"{start}->{end}"
        out[name] = {
            "n": len(values),
            "p50_ms": _round(float(np.percentile(values, 50))) if values else None,
            "p95_ms": _round(float(np.percentile(values, 95))) if values else None,
        }
    heard = [t for t in turns if t.transcripts]
    pairs = [(t.question.text, " ".join(t.transcripts)) for t in heard]
    out["wer"] = round(word_error_rate(pairs), 4) if heard else None
    scored = [t for t in turns if t.question.keywords]
    hit = sum(hits(" ".join(t.answers), t.question.keywords) for t in scored)
    out["keyword_hit_rate"] = round(hit / len(scored), 3) if scored else None
    out["early_stops"] = sum(t.early_stops for t in turns)
    out["answer_audio_s_mean"] = round(float(np.mean([t.audio_s for t in turns])), 2)
    out["mic_lag_max_ms"] = _round(max((t.mic_lag_s for t in turns), default=0.0) * 1000)
    out["per_turn"] = [t.record() for t in turns]
    return out


def table(title: str, results: dict[str, Any]) -> str:
    lines = [title, f"  {'interval':34} {'n':>3} {'p50 ms':>8} {'p95 ms':>8}"]
    for start, end in INTERVALS:
        row = results[f"{start}->{end}"]
        p50 = "-" if row["p50_ms"] is None else f"{row['p50_ms']:.0f}"
        p95 = "-" if row["p95_ms"] is None else f"{row['p95_ms']:.0f}"
        lines.append(f"  {start + ' -> ' + end:34} {row['n']:>3} {p50:>8} {p95:>8}")
    wer = results["wer"]
    hit = results["keyword_hit_rate"]
    lines.append(f"  word error rate {'-' if wer is None else f'{wer:.1%}'}")
    lines.append(f"  key-word hit rate {'-' if hit is None else f'{hit:.0%}'}")
    lines.append(f"  turns cut before the question ended: {results['early_stops']}")
    lines.append(f"  answer audio, mean: {results['answer_audio_s_mean']} s")
    lines.append(f"  microphone pacing, worst lag: {results['mic_lag_max_ms']} ms")
    if "wall_s" in results:
        lines.append(f"  wall time: {results['wall_s']} s")
    return "\n".join(lines)
