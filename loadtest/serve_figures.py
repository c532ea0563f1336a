"""The serve benchmark's figures: what its clients heard, per level, as distributions.

Every figure is given as n, p50, p95, p99, max and mean over a level's requests, with one
rule: p99 only where n >= 100 (below that the 99th percentile is the largest sample or
close to it, a max by another name), and where it is left out the report says why. The
figures a listener cares about: first audio after the server's `speech_stopped` (and from
the end of the speech sent), the answer's RTF as heard, and playback stalls (each answer's
total wait, and its longest).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .omni_serve_client import Request

P99_MIN_N = 100
"""The fewest requests a p99 is printed for."""
FIGURES = ("first_audio_after_stop_ms", "rtf_heard", "stall_ms")
"""The three a level's table row shows."""


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """n, p50, p95, p99 (None, with the reason, where n < P99_MIN_N), max and mean."""
    n = len(values)
    if not n:
        return {"n": 0}
    a = np.asarray(values, dtype=np.float64)

    def pct(q: float) -> float:
        return round(float(np.percentile(a, q)), 3)

    out: dict[str, Any] = {"n": n, "p50": pct(50), "p95": pct(95), "p99": None}
    if n >= P99_MIN_N:
        out["p99"] = pct(99)
    else:
        out["p99_left_out"] = f"n = {n} < {P99_MIN_N}"
    out.update(max=round(float(a.max()), 3), mean=round(float(a.mean()), 3))
    return out


def request_figures(requests: Sequence[Request]) -> dict[str, Any]:
    """A level's (or one set's) measured requests as distributions."""
    measured = [r for r in requests if not r.warmup]
    heard = [r for r in measured if r.first_audio_ms is not None and r.error is None]
    refused = [r for r in measured if r.refused]
    return {
        "requests": len(measured),
        "with_audio": len(heard),
        "refused": len(refused),
        "refusals": sorted({r.error for r in refused if r.error})[:3],
        "errors": [r.error for r in measured if r.error and not r.refused][:5],
        "error_count": sum(
            1 for r in measured if not r.refused and (r.error or r.first_audio_ms is None)
        ),
        "first_audio_after_stop_ms": distribution(
            [x for r in heard if (x := r.first_audio_after_stop_ms) is not None]
        ),
        "first_audio_ms": distribution([r.first_audio_ms for r in heard if r.first_audio_ms]),
        "rtf_heard": distribution([x for r in heard if (x := r.rtf_heard) is not None]),
        "stall_ms": distribution([r.stall_total_ms for r in heard]),
        "stall_max_ms": distribution([r.stall_max_ms for r in heard]),
        "speech_stopped_ms": distribution(
            [r.speech_stopped_ms for r in heard if r.speech_stopped_ms is not None]
        ),
        "first_text_ms": distribution([r.first_text_ms for r in heard if r.first_text_ms]),
        "audio_s": distribution([r.audio_s for r in heard]),
        "question_s": distribution([r.speech_s for r in measured]),
    }


def graph_means(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float | None]:
    """Per stage, the mean of `parley_stage_first_chunk_seconds` between two readings (ms)."""
    out: dict[str, float | None] = {}
    for stage, (total, count) in after.items():
        total0, count0 = before.get(stage, (0.0, 0.0))
        n = count - count0
        out[stage] = round((total - total0) / n * 1000, 1) if n > 0 else None
    return out


def session_share(figures: dict[str, Any], graph_ms: dict[str, float | None]) -> float | None:
    """The session layer's part of first audio: after-stop mean less the graph's own."""
    audio_graph = graph_ms.get("code2wav") or next(reversed(graph_ms.values()), None)
    mean = figures["first_audio_after_stop_ms"].get("mean")
    return round(mean - audio_graph, 1) if audio_graph is not None and mean is not None else None


# --- tables --------------------------------------------------------------------------------


def _cells(d: dict[str, Any], spec: str) -> str:
    return " ".join(_cell(d.get(k), spec) for k in ("p50", "p95", "p99", "max"))


def _cell(value: Any, spec: str) -> str:
    width = int(spec.split(".")[0])
    return format(value, spec) if isinstance(value, int | float) else "-".rjust(width)


def row_head() -> str:
    return (
        f"{'n':>5} {'first audio after stop, ms':>27} {'RTF as heard':>27}"
        f" {'stall per answer, ms':>27}\n{'':24}{'':>5}"
        + "".join(f" {'p50':>6} {'p95':>6} {'p99':>6} {'max':>6}" for _ in FIGURES)
    )


def row(label: str, figures: dict[str, Any]) -> str:
    fa, rtf, stall = (figures[key] for key in FIGURES)
    refused = figures.get("refused")
    said = f"  ({refused} refused: {'; '.join(figures['refusals'])})" if refused else ""
    return (
        f"{label:24}{figures['requests']:>5} {_cells(fa, '6.0f')}"
        f" {_cells(rtf, '6.2f')} {_cells(stall, '6.0f')}{said}"
    )


def p99_note(rows: Sequence[dict[str, Any]]) -> str | None:
    short = [f["requests"] for f in rows if f["first_audio_after_stop_ms"].get("p99") is None]
    if not short:
        return None
    return (
        f"p99 left out ('-') where a row has fewer than {P99_MIN_N} answers heard"
        f" (n = {', '.join(str(n) for n in short)})"
    )
