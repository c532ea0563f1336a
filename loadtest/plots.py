"""Charts for the benchmark pages, drawn from the JSON reports in `loadtest/results/`.

`python -m loadtest.plots` redraws every chart into `docs/benchmarks/plots/` (PNG); run it
whenever a report there changes, and commit the charts with it. Each chart names the
reports it was drawn from in its footnote, and each series its machine, date and commit,
so a chart is never read apart from where its figures came from. A report that is missing
leaves its series out (the footnote says which); a chart with no series is not drawn.

Charts:
- `qwen3_omni_served.png`: first audio after the server's speech_stopped (p50, p95)
  against sessions, from `omni_serve_bench` reports (the shipped graph's H100 runs, and
  earlier H200 runs with other settings, labelled as such).
- `qwen3_omni_graph.png`: the graph's own first audio (p50, p95) against concurrency, from
  `omni_bench` reports.
- `moshi_frames.png`: one frame step of every session (p50, p95) against sessions, with the
  80 ms frame budget, and what a client hears of it, from `moshi_steps` and
  `duplex_latency` reports.
- `fault_recovery.png`: per injected fault, seconds until the client was told, `/readyz`
  turned red and the service was back, from `fault_drill` reports.

- `interruption_cut_latency.png`: each mode's cut latencies, from an `interruption_bench`
  report.
- `webrtc_calls_held.png`: outbound audio late against calls, WebRTC frames from a
  `webrtc_bench --json` report and SIP's RTP packets from a `sip_bench --json` one.
- `webrtc_barge_in.png`: barge-in latencies alone and beside the calls, from the
  `webrtc_bench` report.

- `peers_barge_in.png`: WebRTC barge-in latencies of Parley, FastRTC and Pipecat measured
  in one run, from `loadtest.peers.run --out` reports.

A chart is drawn only from a kept report, never from figures typed in here.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
WEBRTC_BENCH = "webrtc_bench_cpu_2026-12-06.json"
PEERS = "peers_cpu_2026-12-06"
OUT = Path(__file__).parents[1] / "docs" / "benchmarks" / "plots"


@dataclass
class Series:
    label: str
    x: list[float]
    ys: dict[str, list[float | None]]
    """Per statistic (p50, p95): one value per x."""


@dataclass
class Chart:
    name: str
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    budget: tuple[float, str] | None = None
    """A horizontal line: (value, what it is)."""


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def stamp(header: dict[str, Any]) -> str:
    """`device, date, commit` of a report's header, as far as it says."""
    machine = header.get("machine") or {}
    gpu = str(machine.get("gpu") or header.get("device") or "").split(",")[0]
    gpu = gpu.replace("NVIDIA ", "")
    date = str(header.get("started_utc") or header.get("date") or header.get("run_at") or "")[:10]
    commit = str(header.get("commit") or "")[:7]
    return ", ".join(part for part in (gpu, date, commit) if part)


def gather(chart: Chart, names: Sequence[str], read: Callable[[str, dict[str, Any]], Any]) -> None:
    """Add each report's series (or bars) through `read`, noting the ones missing."""
    for name in names:
        report = load(name)
        if report is None:
            chart.missing.append(name)
            continue
        found = read(name, report)
        if found:
            chart.series.extend(found if isinstance(found, list) else [found])
            chart.sources.append(name)


def point_series(label: str, points: list[tuple[float, Any, Any]]) -> Series | None:
    """A series of (x, p50, p95) points, in x's order; None without a point."""
    if not points:
        return None
    points.sort()
    return Series(
        label,
        [p[0] for p in points],
        {"p50": [p[1] for p in points], "p95": [p[2] for p in points]},
    )


def served_series(label: str) -> Callable[[str, dict[str, Any]], Series | None]:
    def read(name: str, report: dict[str, Any]) -> Series | None:
        points: list[tuple[float, Any, Any]] = []
        for level in report.get("levels", []):
            after = level["figures"].get("first_audio_after_stop_ms") or {}
            if after.get("p50") is not None:
                points.append((level["sessions"], after["p50"], after.get("p95")))
        return point_series(f"{label} ({stamp(report['header'])})", points)

    return read


def graph_series(name: str, report: dict[str, Any]) -> Series | None:
    phase = report.get("parley") or {}
    points: list[tuple[float, Any, Any]] = []
    for key, level in phase.items():
        if key.startswith("c") and key[1:].isdigit() and isinstance(level, dict):
            first = level.get("first_audio_ms") or {}
            if first.get("p50") is not None:
                points.append((int(key[1:]), first["p50"], first.get("p95")))
    return point_series(f"{name.removesuffix('.json')} ({stamp(report['header'])})", points)


def levels_series(key: str, label: str) -> Callable[[str, dict[str, Any]], Series | None]:
    def read(name: str, report: dict[str, Any]) -> Series | None:
        levels = report.get("levels") or {}
        points: list[tuple[float, Any, Any]] = [
            (int(n), level[key]["p50"], level[key].get("p95"))
            for n, level in levels.items()
            if isinstance(level.get(key), dict) and level[key].get("p50") is not None
        ]
        device = (report.get("argv") or {}).get("device", "")
        return point_series(f"{label} ({name.removesuffix('.json')}, {device})", points)

    return read


def fault_bars(name: str, report: dict[str, Any]) -> list[Series]:
    where = f"{report.get('pipeline')}, {stamp({**report, **(report.get('source') or {})})}"
    return [
        Series(
            f"{fault['fault']} ({where})",
            [0, 1, 2],
            {"s": [fault.get("told_s") or 0, fault.get("red_s") or 0, fault.get("back_s") or 0]},
        )
        for fault in report.get("faults", [])
        if fault.get("fired")
    ]


def distribution(label: str, values: Sequence[float] | None) -> Series | None:
    """`values` sorted, each with the share of them at or under it (None: no value)."""
    ms = sorted(values or [])
    if not ms:
        return None
    shares: list[float | None] = [(k + 1) / len(ms) for k in range(len(ms))]
    return Series(label, ms, {"share": shares})


def step_series(label: str, points: list[tuple[float, float]]) -> Series | None:
    """One value a step (drawn as the solid line), in the order given; None without one."""
    if not points:
        return None
    values: list[float | None] = [p[1] for p in points]
    return Series(label, [p[0] for p in points], {"p50": values, "p95": [None] * len(points)})


def cut_latency_series(name: str, report: dict[str, Any]) -> list[Series]:
    """Each mode's cut latencies (a real interruption's first voiced sample to the old
    answer's last sample heard), sorted: a distribution, drawn as the share at or under."""
    where = stamp(report.get("header") or {})
    found = (
        distribution(f"{mode} ({where})", (figures.get("cut_latency") or {}).get("ms"))
        for mode, figures in (report.get("figures") or {}).items()
    )
    return [series for series in found if series is not None]


def calls_held_series(name: str, report: dict[str, Any]) -> Series | None:
    """Each step of a `webrtc_bench` report: the share of outbound frames late, by calls."""
    steps = report.get("steps") or []
    points = [(float(s["calls"]), round(float(s["late_pct"]), 3)) for s in steps]
    cores = ((report.get("header") or {}).get("machine") or {}).get("cores")
    label = f"WebRTC, late frames ({stamp(report.get('header') or {})}, {cores} cores)"
    return step_series(label, points)


def sip_held_series(name: str, report: dict[str, Any]) -> Series | None:
    """Each step of a `sip_bench --json` report: the probes' RTP packets late, by calls."""
    steps = report.get("steps") or []
    points = [(float(s["calls"]), float(s["late_packets_pct"])) for s in steps]
    label = f"SIP, late RTP packets ({stamp(report)}, {report.get('cores')} cores)"
    return step_series(label, points)


def barge_in_series(name: str, report: dict[str, Any]) -> list[Series]:
    """A `webrtc_bench` report's barge-in latencies alone, then those beside each step's
    calls (`--barge-under-load`), as distributions (the share at or under)."""
    where = stamp(report.get("header") or {})
    found = [("alone", (report.get("barge_in") or {}).get("ms") or [])]
    for step in report.get("steps") or []:
        found.append((f"beside {step['calls']} calls", (step.get("barge_in") or {}).get("ms")))
    drawn = (distribution(f"{label} ({where})", values) for label, values in found)
    return [series for series in drawn if series is not None]


def peer_barge_series(name: str, report: dict[str, Any]) -> Series | None:
    """One peer's barge-in latencies (`loadtest.peers.run --out`), as a distribution."""
    label = f"{report.get('peer', name)} ({stamp(report)}, {report.get('cpus')} cores)"
    return distribution(label, ((report.get("raw") or {}).get("barge") or {}).get("barge_ms"))


def charts() -> list[Chart]:
    served = Chart(
        "qwen3_omni_served",
        "Qwen3-Omni served: first audio after speech_stopped",
        "sessions asking at once",
        "ms (p50 solid, p95 dashed)",
    )
    gather(
        served,
        ["omni_serve_h100_2026-12-06.json", "omni_serve_h100_rounds_1_6_10_2026-12-06.json"],
        served_series("shipped qwen3_omni.yaml"),
    )
    gather(
        served, ["omni_serve_rounds_h200_2026-12-06.json"], served_series("shipped qwen3_omni.yaml")
    )
    gather(
        served,
        ["omni_serve_h200.json", "omni_serve_h200_mps.json"],
        served_series("earlier settings, see history"),
    )
    graph = Chart(
        "qwen3_omni_graph",
        "Qwen3-Omni graph alone (omni_bench): first audio from the request",
        "requests at once",
        "ms (p50 solid, p95 dashed)",
    )
    gather(graph, ["omni_bench_h200.json", "omni_bench_h200_mps_48_64.json"], graph_series)
    moshi = Chart(
        "moshi_frames",
        "Moshi: a frame for every session",
        "sessions",
        "ms (p50 solid, p95 dashed)",
        budget=(80.0, "80 ms frame"),
    )
    gather(moshi, ["moshi_steps_h200.json"], levels_series("frame_ms", "frame step"))
    gather(
        moshi,
        ["duplex_latency_h200.json"],
        levels_series("heard_by_client_ms", "heard by the client"),
    )
    faults = Chart(
        "fault_recovery",
        "A fault in each GPU stage: told, red, back",
        "",
        "seconds from the fault",
        budget=(60.0, "back within 60 s"),
    )
    gather(
        faults,
        [
            "fault_drill_qwen3_omni_h100_2026-12-06.json",
            "fault_drill_qwen3_omni_stages_h100_2026-12-06.json",
            "fault_drill_moshi_h100_2026-12-06.json",
        ],
        fault_bars,
    )
    cuts = Chart(
        "interruption_cut_latency",
        "A real interruption: from its first voiced sample to the old answer's last",
        "ms",
        "share of interruptions cut by then",
    )
    gather(
        cuts, ["interruption_bench_cascade_cpu_2026-12-06_level_silero.json"], cut_latency_series
    )
    held = Chart(
        "webrtc_calls_held",
        "Calls on the echo pipeline: outbound audio late (WebRTC frames, SIP packets)",
        "calls at once (callers on the same machine)",
        "% of frames late",
        budget=(1.0, "1 % late"),
    )
    gather(held, [WEBRTC_BENCH], calls_held_series)
    gather(held, ["sip_bench_cpu_2026-12-06.json"], sip_held_series)
    barge = Chart(
        "webrtc_barge_in",
        "WebRTC barge-in: first frame of speech sent to the answer's last frame heard",
        "ms",
        "share of interruptions cut by then",
    )
    gather(barge, [WEBRTC_BENCH], barge_in_series)
    peers = Chart(
        "peers_barge_in",
        "WebRTC barge-in beside its peers (one aiortc caller, no model time)",
        "ms",
        "share of interruptions cut by then",
    )
    gather(
        peers,
        [f"{PEERS}/{peer}.json" for peer in ("parley", "fastrtc", "pipecat")],
        peer_barge_series,
    )
    return [served, graph, moshi, faults, cuts, held, barge, peers]


def draw(chart: Chart, out: Path) -> Path | None:
    """Draw `chart` into `out`/<name>.png; None if it has no series."""
    if not chart.series:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=110)
    if chart.name == "fault_recovery":
        width = 0.8 / len(chart.series)
        for k, series in enumerate(chart.series):
            xs = [x + k * width for x in series.x]
            bars = axes.bar(xs, [y or 0.0 for y in series.ys["s"]], width, label=series.label)
            axes.bar_label(bars, fmt="%.2g", fontsize=6)  # told and red are under a second
        axes.set_xticks([x + 0.4 - width / 2 for x in (0, 1, 2)])
        axes.set_xticklabels(["client told", "/readyz red", "service back"])
    elif chart.name in ("interruption_cut_latency", "webrtc_barge_in", "peers_barge_in"):
        for series in chart.series:
            axes.step(
                series.x,
                [y or 0.0 for y in series.ys["share"]],
                where="post",
                marker="o",
                label=series.label,
            )
        axes.set_xlabel(chart.xlabel)
        axes.set_ylim(0, 1.05)
    else:
        for series in chart.series:
            p50 = [y or 0.0 for y in series.ys["p50"]]  # a level has a p50 to be a point
            (line,) = axes.plot(series.x, p50, marker="o", label=series.label)
            p95 = [(x, y) for x, y in zip(series.x, series.ys["p95"], strict=True) if y is not None]
            if p95:
                axes.plot(*zip(*p95, strict=True), linestyle="--", color=line.get_color())
        axes.set_xlabel(chart.xlabel)
    if chart.budget is not None:
        value, said = chart.budget
        axes.axhline(value, color="grey", linewidth=1, linestyle=":")
        axes.annotate(said, (0.01, value), xycoords=("axes fraction", "data"), fontsize=8)
    axes.set_title(chart.title, fontsize=11)
    axes.set_ylabel(chart.ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    note = "from loadtest/results/: " + ", ".join(chart.sources)
    if chart.missing:
        note += "; missing: " + ", ".join(chart.missing)
    figure.text(0.01, 0.01, note, fontsize=6, wrap=True)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{chart.name}.png"
    figure.savefig(path, metadata={"Software": None})  # no version stamp: same input, same file
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where the PNGs go")
    args = parser.parse_args(argv)
    for chart in charts():
        path = draw(chart, args.out)
        if path is None:
            print(f"{chart.name}: no report to draw from ({', '.join(chart.missing)})")
        else:
            print(f"{path}: {len(chart.series)} series from {', '.join(chart.sources)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
