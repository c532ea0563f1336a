"""From raw measurements to figures, and from figures of one run to a table of ratios.

The project's rule: a peer is reported as a ratio to Parley measured in the same run (same
machine, same load on it, same client), never as bare times from another day. So the table
gives Parley's own figure and, for each peer, its figure and `peer / Parley`: above 1 means
the peer takes longer (times) or holds more (calls) or burns more (CPU). CPU is compared at
one call, the one step every peer runs (per-step CPU is in each peer's JSON).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# (key, label, unit) in table order
METRICS = (
    ("connect_p50_ms", "connect p50", "ms"),
    ("turn_p50_ms", "turn latency p50", "ms"),
    ("turn_p95_ms", "turn latency p95", "ms"),
    ("barge_p50_ms", "barge-in p50", "ms"),
    ("barge_p95_ms", "barge-in p95", "ms"),
    ("max_ok_calls", "calls held (< 1 % late)", "calls"),
    ("cpu_1_call_pct", "server CPU, 1 call", "%"),
)
NAMES = {"parley": "Parley (echo)", "fastrtc": "FastRTC 0.0.34", "pipecat": "Pipecat 1.14.0"}


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def figures(raw: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of one peer's raw results (absent tests give no key)."""
    out: dict[str, Any] = {}
    if "connect_ms" in raw:
        out["connect_p50_ms"] = percentile(raw["connect_ms"], 50)
    if "turn_ms" in raw:
        out["turn_p50_ms"] = percentile(raw["turn_ms"], 50)
        out["turn_p95_ms"] = percentile(raw["turn_ms"], 95)
    if "barge" in raw:
        out["barge_p50_ms"] = percentile(raw["barge"]["barge_ms"], 50)
        out["barge_p95_ms"] = percentile(raw["barge"]["barge_ms"], 95)
        out["not_interrupted"] = raw["barge"]["not_interrupted"]
    if "capacity" in raw:
        steps = raw["capacity"]["steps"]
        out["max_ok_calls"] = raw["capacity"]["max_ok_calls"]
        one = [s for s in steps if s["calls"] == 1]
        out["cpu_1_call_pct"] = one[0]["server_cpu_pct"] if one else None
    return out


def ratio(peer: float | None, parley: float | None) -> float | None:
    if peer is None or parley is None or parley == 0:
        return None
    return round(peer / parley, 2)


def _cell(value: Any, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "calls":
        return f"{value:.0f}"
    return f"{value:.0f} {unit}" if unit == "ms" else f"{value:.1f} {unit}"


def table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per metric, Parley's figure, each peer's figure and ratio."""
    peers = [p for p in ("fastrtc", "pipecat") if p in results]
    parley = results.get("parley", {})
    head = ["metric", NAMES["parley"]]
    for peer in peers:
        head += [NAMES[peer], f"{peer} / Parley"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label, unit in METRICS:
        if not any(key in r for r in results.values()):
            continue
        row = [label, _cell(parley.get(key), unit)]
        for peer in peers:
            mine = results[peer].get(key)
            quotient = ratio(mine, parley.get(key))
            row += [_cell(mine, unit), "–" if quotient is None else f"{quotient:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    notes = [
        f"{NAMES[p]}: {r['not_interrupted']} barge-in tries not cut short"
        for p, r in results.items()
        if r.get("not_interrupted")
    ]
    return "\n".join(lines + ([""] + notes if notes else []))
