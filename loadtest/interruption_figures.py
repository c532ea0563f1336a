"""The interruption bench's figures per mode, from each case's outcome, and their table.

"Interrupt" is the positive class: a real interruption should cut the answer, every other
sound (backchannel, noise burst, cough, second voice) should leave it whole.

* precision: of the answers cut, the share cut by a real interruption; recall: of the real
  interruptions, the share that cut the answer;
* wrongly cut: of the answers under anything else, the share cut;
* audio lost: for an answer wrongly cut, the answer's audio the client never heard (the
  answer's whole length, the median of the answers heard whole in the run, less what was
  heard); in all, per wrong cut, and per answer under a sound that should have kept it;
* cut latency: for real interruptions that cut, from the interruption's first voiced sample
  to the last sample of the old answer the client played.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .interruption_call import Outcome
from .interruption_set import KINDS


def latency_figures(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "n": len(values),
        **{f"p{q}_ms": round(float(np.percentile(values, q)), 1) for q in (50, 95, 99)},
        "max_ms": round(max(values), 1),
        "ms": [round(v, 1) for v in values],
    }


def _share(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(part / whole, 4)


def mode_figures(outcomes: list[Outcome], answer_ms: float) -> dict[str, Any]:
    """The figures of one mode's outcomes; `answer_ms`: an answer's whole length."""
    done = [o for o in outcomes if o.cut is not None]
    real = [o for o in done if o.case.sound.interrupt]
    other = [o for o in done if not o.case.sound.interrupt]
    hits = sum(1 for o in real if o.cut)
    wrong = [o for o in other if o.cut]
    lost = [max(0.0, answer_ms - o.heard_ms) for o in wrong]
    latencies = [o.last_frame_ms for o in real if o.cut and o.last_frame_ms is not None]
    by_kind = {}
    for kind in KINDS:
        of_kind = [o for o in done if o.case.sound.kind == kind]
        by_kind[kind] = {
            "n": len(of_kind),
            "cut": sum(1 for o in of_kind if o.cut),
            "cut_share": _share(sum(1 for o in of_kind if o.cut), len(of_kind)),
            "vad_heard": sum(1 for o in of_kind if o.vad_heard),
        }
    return {
        "cases": len(outcomes),
        "failed": len(outcomes) - len(done),
        "failures": sorted({o.failure for o in outcomes if o.failure})[:5],
        "precision": _share(hits, hits + len(wrong)),
        "recall": _share(hits, len(real)),
        "wrongly_cut_share": _share(len(wrong), len(other)),
        "wrongly_cut": len(wrong),
        "kept_whole": len(other) - len(wrong),
        "audio_lost_ms": {
            "total": round(sum(lost)),
            "per_wrong_cut": round(float(np.mean(lost))) if lost else 0,
            "per_answer": round(sum(lost) / len(other)) if other else None,
        },
        "cut_latency": latency_figures(latencies),
        "by_kind": by_kind,
        "mic_lag_max_ms": round(max((o.mic_lag_ms for o in outcomes), default=0.0), 1),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(figures: dict[str, dict[str, Any]]) -> str:
    """Each mode's figures as printed lines: the headline, then the share cut per kind."""
    lines = [
        f"{'mode':<10}{'cases':>6}{'fail':>5}{'precision':>10}{'recall':>8}{'wrongly cut':>12}"
        f"{'lost ms':>9}{'/wrong cut':>11}   cut latency ms: {'n':>3}{'p50':>6}{'p95':>6}"
        f"{'p99':>6}{'max':>6}"
    ]
    for mode, f in figures.items():
        lost, lat = f["audio_lost_ms"], f["cut_latency"]
        lines.append(
            f"{mode:<10}{f['cases']:>6}{f['failed']:>5}{_pct(f['precision']):>10}"
            f"{_pct(f['recall']):>8}{_pct(f['wrongly_cut_share']):>12}{lost['total']:>9}"
            f"{lost['per_wrong_cut']:>11}   {'':16}{lat['n']:>3}{_ms(lat['p50_ms']):>6}"
            f"{_ms(lat['p95_ms']):>6}{_ms(lat['p99_ms']):>6}{_ms(lat['max_ms']):>6}"
        )
    lines.append("")
    lines.append("answers cut, by what was said over them (cut / cases):")
    lines.append(f"{'mode':<10}" + "".join(f"{kind:>15}" for kind in KINDS))
    for mode, f in figures.items():
        cells = [f"{k['cut']}/{k['n']}" for k in f["by_kind"].values()]
        lines.append(f"{mode:<10}" + "".join(f"{cell:>15}" for cell in cells))
    return "\n".join(lines)
