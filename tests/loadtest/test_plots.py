"""The benchmark pages' charts, drawn from the reports kept in loadtest/results/."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest import plots


def test_every_chart_is_drawn_from_the_kept_reports(tmp_path: Path) -> None:
    assert plots.main(["--out", str(tmp_path)]) == 0
    drawn = sorted(p.name for p in tmp_path.glob("*.png"))
    assert drawn == sorted(f"{chart.name}.png" for chart in plots.charts())
    served = next(c for c in plots.charts() if c.name == "qwen3_omni_served")
    shipped = served.series[0]
    assert shipped.label.startswith("shipped qwen3_omni.yaml (H100 80GB HBM3, 2026-12-06")
    assert shipped.x == [1, 3] and shipped.ys["p50"] == [653.5, 393.1]


def test_the_interruption_chart_is_each_modes_cut_latencies_as_a_distribution() -> None:
    cuts = next(c for c in plots.charts() if c.name == "interruption_cut_latency")
    by_mode = {series.label.split(" ")[0]: series for series in cuts.series}
    assert set(by_mode) == {"always", "adaptive"}
    for series in by_mode.values():
        assert series.x == sorted(series.x) and len(series.x) == 9  # the 9 interruptions
        assert series.ys["share"][-1] == 1.0
    assert max(by_mode["adaptive"].x) == pytest.approx(543.0)


def test_a_missing_report_is_named_and_an_empty_chart_not_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plots, "RESULTS", tmp_path / "none")
    for chart in plots.charts():
        assert not chart.series and chart.missing
        assert plots.draw(chart, tmp_path) is None
    assert not list(tmp_path.glob("*.png"))


def test_the_webrtc_charts_are_the_kept_benchs_steps_and_barge_ins() -> None:
    held = next(c for c in plots.charts() if c.name == "webrtc_calls_held")
    late, sip = held.series
    assert sip.label.startswith("SIP") and sip.x == [1, 10, 20, 30]
    assert late.x == [10, 20, 30] and late.ys["p50"] == [0.0, 0.0, 17.509]
    assert "2 cores" in late.label
    barge = next(c for c in plots.charts() if c.name == "webrtc_barge_in")
    (alone,) = barge.series  # no step of that run had barge-ins beside it
    assert len(alone.x) == 20 and max(alone.x) == pytest.approx(201.9)
    assert alone.ys["share"][-1] == 1.0


def test_the_peers_chart_holds_each_peer_of_one_run() -> None:
    peers = next(c for c in plots.charts() if c.name == "peers_barge_in")
    assert [s.label.split(" ")[0] for s in peers.series] == ["parley", "fastrtc", "pipecat"]
    runs = {s.label.split(", ")[1] for s in peers.series}
    assert len(runs) == 1  # one run, one commit: ratios, not times from other days
