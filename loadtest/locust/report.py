"""The load test's report: one JSON file and one HTML page with plots, built from exact samples.

`step(...)` turns one step's merged samples and counters (stats.merge) and the server's
counters into figures: exact percentiles of every figure (not Locust's rounded ones), the
late-frame ratios, and the verdict against the targets. `write(...)` puts the header, the
steps, the resource timeline, the quality figure and churn in `report.json` and draws
`report.html` (inline SVG, no scripts: it works offline).
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from .stats import BARGE_IN, CHUNK_LAG, GENERATOR, LOOP_LAG
from .svg import line_chart

PERCENTILES = (50, 90, 95, 99)
TARGETS = {
    "late_frames_pct": 1.0,  # the server's parley_webrtc_late_frames_total, and the client's
    "barge_in_p95_ms": 260.0,
    "ws_chunk_lag_p95_ms": 50.0,
}
"""Limits of the issue's targets; a step at or over one (late frames) or over one fails."""
GENERATOR_LAG_P95_MS = 50.0
"""The load generator's loop is late by more than this at p95: its figures are suspect."""


def summary(values: list[float]) -> dict[str, float]:
    """n, mean, min, exact percentiles and max of `values` (ms)."""
    if not values:
        return {"n": 0}
    array = np.asarray(values, dtype=np.float64)
    out = {"n": float(len(array)), "mean": float(array.mean()), "min": float(array.min())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(array, p))
    out["max"] = float(array.max())
    return {k: round(v, 3) for k, v in out.items()}


def step(
    users: int,
    protocols: list[str],
    samples: dict[str, list[float]],
    counters: dict[str, float],
    server: dict[str, float],
) -> dict[str, Any]:
    """One step's figures and verdict. `server`: the server's counters over the step."""
    figures = {key: summary(values) for key, values in sorted(samples.items())}
    checks: dict[str, dict[str, float | bool]] = {}
    lengths: dict[str, float] = {}
    out_frames = server.get("outbound_frames", 0.0)
    if out_frames:
        late_pct = 100 * server.get("late_frames", 0.0) / out_frames
        checks["late_frames_pct"] = _check(late_pct, TARGETS["late_frames_pct"], inclusive=True)
    for protocol in protocols:
        frames = counters.get(f"{protocol} frames", 0)
        if frames:
            client_pct = 100 * counters.get(f"{protocol} late_frames", 0) / frames
            checks["client_late_frames_pct"] = _check(client_pct, TARGETS["late_frames_pct"], True)
        barge = figures.get(f"{protocol} {BARGE_IN}", {})
        if protocol != "VIDEO" and barge.get("n"):  # video's includes the spoken words
            checks[f"{protocol} barge_in_p95_ms"] = _check(barge["p95"], TARGETS["barge_in_p95_ms"])
        lag = figures.get(f"{protocol} {CHUNK_LAG}", {})
        if protocol == "WS" and lag.get("n"):
            checks["ws_chunk_lag_p95_ms"] = _check(lag["p95"], TARGETS["ws_chunk_lag_p95_ms"])
        checks[f"{protocol} session_errors"] = _check(counters.get(f"{protocol} errors", 0), 0.0)
        answers = counters.get(f"{protocol} answers", 0)
        if answers and f"{protocol} answer_audio_s" in counters:
            lengths[protocol] = round(counters[f"{protocol} answer_audio_s"] / answers, 2)
    generator = figures.get(f"{GENERATOR} {LOOP_LAG}", {})
    return {
        "users": users,
        "protocols": protocols,
        "figures": figures,
        "counters": counters,
        "server": server,
        "checks": checks,
        "answer_audio_s_mean": lengths,
        "ok": all(bool(c["ok"]) for c in checks.values()),
        "generator_overloaded": bool(generator.get("n"))
        and generator.get("p95", 0) > GENERATOR_LAG_P95_MS,
    }


def _check(value: float, limit: float, inclusive: bool = False) -> dict[str, float | bool]:
    ok = value < limit if inclusive else value <= limit
    return {"value": round(value, 3), "limit": limit, "ok": ok}


def write(directory: Path, report: dict[str, Any]) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, html_path = directory / "report.json", directory / "report.html"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    html_path.write_text(html(report))
    return json_path, html_path


def _table(rows: list[list[Any]], head: list[str]) -> str:
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{cells}</tr>{body}</table>"


def _charts(report: dict[str, Any]) -> list[str]:
    steps: list[dict[str, Any]] = report.get("steps", [])
    charts = []
    keys = sorted({k for s in steps for k in s["figures"]})
    for key in keys:
        series = {
            f"p{p}": [
                (s["users"], s["figures"][key][f"p{p}"])
                for s in steps
                if s["figures"].get(key, {}).get("n")
            ]
            for p in (50, 95, 99)
        }
        charts.append(line_chart(f"{key} per step", "users", "ms", series))
    late = {
        name: [(s["users"], s["checks"][name]["value"]) for s in steps if name in s["checks"]]
        for name in ("late_frames_pct", "client_late_frames_pct")
    }
    charts.append(line_chart("late frames per step", "users", "%", late))
    timeline: list[dict[str, float]] = report.get("timeline", [])
    for field, unit in (("cpu_pct", "%"), ("rss_mb", "MB"), ("runq_pct", "% of time")):
        series = {
            who: [(t["t"], t[f"{who}_{field}"]) for t in timeline if f"{who}_{field}" in t]
            for who in ("server", "generator")
        }
        charts.append(line_chart(f"{field} over time", "s", unit, series))
    return charts


def html(report: dict[str, Any]) -> str:
    header = report.get("header", {})
    head_rows = [[k, json.dumps(v) if isinstance(v, dict | list) else v] for k, v in header.items()]
    step_rows = []
    for s in report.get("steps", []):
        checks = ", ".join(
            f"{k} {c['value']:g}{'' if c['ok'] else ' FAIL'}" for k, c in s["checks"].items()
        )
        verdict = ("ok" if s["ok"] else "FAIL") + (
            " (generator overloaded)" if s.get("generator_overloaded") else ""
        )
        step_rows.append([s["users"], " ".join(s["protocols"]), verdict, checks])
    figure_rows = [
        [s["users"], key, *(f.get(c, "") for c in ("n", "p50", "p90", "p95", "p99", "max"))]
        for s in report.get("steps", [])
        for key, f in s["figures"].items()
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Parley load test</title>",
        "<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;"
        "padding:2px 6px;font-size:12px}table{border-collapse:collapse;margin:1em 0}</style>",
        "</head><body><h1>Parley load test</h1>",
        "<h2>Header</h2>",
        _table(head_rows, ["what", "value"]),
        "<h2>Steps</h2>",
        _table(step_rows, ["users", "protocol", "verdict", "checks"]),
        f"<p>First step to fail: {escape(str(report.get('first_failed')))}</p>",
        "<h2>Plots</h2>",
        *_charts(report),
        "<h2>Figures (ms, exact percentiles)</h2>",
        _table(figure_rows, ["users", "figure", "n", "p50", "p90", "p95", "p99", "max"]),
        "<h2>Quality</h2>",
        f"<pre>{escape(json.dumps(report.get('quality'), indent=2))}</pre>",
        "<h2>Churn</h2>",
        f"<pre>{escape(json.dumps(report.get('churn'), indent=2))}</pre>",
        "</body></html>",
    ]
    return "\n".join(parts)
