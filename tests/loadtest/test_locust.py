"""The Locust load test end to end on a tiny step, and its report builder on canned samples.

The end-to-end test runs `python -m loadtest.locust.run` in a child process (Locust's gevent
patching must never reach the test process): `parley serve --pipeline echo` on a Redis of
its own, one WebSocket, one WebRTC, one video and one SIP user for one short step, then the report,
which must carry every figure of issue 14's Locust section with sane values.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.locust import report as reports
from loadtest.locust.clips import read_clips, write_clips
from loadtest.locust.stats import Recorder, merge
from loadtest.locust.svg import line_chart

HEADER_KEYS = {
    "commit",
    "versions",
    "hardware",
    "graph",
    "input_set",
    "warmup_s",
    "steps",
    "turns_per_session",
    "barge_every",
}


def _figure(step: dict[str, Any], key: str) -> dict[str, float]:
    figure = step["figures"].get(key)
    assert figure and figure["n"] >= 1, f"{key} missing: {sorted(step['figures'])}"
    assert 0 <= figure["min"] <= figure["p50"] <= figure["p95"] <= figure["max"]
    return dict(figure)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_locust_step_over_every_protocol_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "loadtest.locust.run", "--protocol", "ws,webrtc,video,sip"]
    cmd += ["--steps", "4", "--step-s", "18", "--warmup-s", "0", "--turns", "2"]
    cmd += ["--barge-every", "2", "--asr", "pocketsphinx", "--report", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=85)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads((out / "report.json").read_text())

    assert set(result["header"]) >= HEADER_KEYS
    assert result["header"]["graph"]["name"] == "echo"
    assert {"parley", "aiortc", "locust"} <= set(result["header"]["versions"])
    assert result["header"]["hardware"]["cores"] >= 1
    (step,) = result["steps"]
    assert step["users"] == 4
    for protocol in ("WS", "WebRTC", "VIDEO", "SIP"):
        for key in ("connect", "voice_to_voice", "processing"):
            if (protocol, key) != ("SIP", "processing"):  # SIP has no speech_stopped event
                assert _figure(step, f"{protocol} {key}")["max"] < 30_000
        assert not step["checks"][f"{protocol} session_errors"]["value"]
    assert _figure(step, "WS voice_to_voice")["min"] > 300  # server VAD waits 500 ms of quiet
    _figure(step, "WS barge_in")
    _figure(step, "WS chunk_lag")
    _figure(step, "WebRTC answer_gap")
    _figure(step, "SIP answer_gap")
    assert _figure(step, "GEN loop_lag")["max"] < 5_000
    assert step["counters"]["WebRTC frames"] > 50
    assert "WebRTC late_frames" in step["counters"] or step["counters"]["WebRTC frames"]
    assert step["server"]["outbound_frames"] > 0
    assert {"late_frames_pct", "ws_chunk_lag_p95_ms", "client_late_frames_pct"} <= set(
        step["checks"]
    )
    quality = result["quality"]
    assert quality["clips"] >= 1 and quality["wer"] is not None and quality["wer"] < 0.5
    timeline = result["timeline"]
    assert timeline and all("server_cpu_pct" in row and "server_rss_mb" in row for row in timeline)
    assert any("generator_cpu_pct" in row and "generator_runq_pct" in row for row in timeline)
    assert {"server_cpu_pct", "server_rss_mb", "server_runq_pct"} <= set(step["resources"])
    assert (out / "step-4" / "locust_stats.csv").exists()  # Locust's own CSV, next to ours
    assert (out / "step-4" / "locust.html").exists()  # and its own HTML report
    page = (out / "report.html").read_text()
    assert page.count("<svg") >= 5 and "<script" not in page and "<link" not in page


def _canned() -> tuple[dict[str, list[float]], dict[str, float]]:
    rec = Recorder()
    for ms in range(1, 101):
        rec.time("WebRTC", "barge_in", float(ms * 3))  # p95 285 ms: over the 260 ms target
        rec.time("WS", "chunk_lag", float(ms) / 10)
        rec.time("GEN", "loop_lag", 1.0)
    rec.count("WebRTC frames", 1000)
    rec.count("WebRTC late_frames", 5)
    return dict(rec.samples), dict(rec.counters)


def test_the_report_builder_takes_exact_percentiles_and_checks_the_targets(tmp_path: Path) -> None:
    samples, counters = _canned()
    server = {"late_frames": 20.0, "outbound_frames": 1000.0}
    step = reports.step(10, ["WS", "WebRTC"], samples, counters, server)
    barge = step["figures"]["WebRTC barge_in"]
    assert barge["n"] == 100 and barge["p50"] == pytest.approx(151.5)
    assert barge["p95"] == pytest.approx(285.15) and barge["max"] == 300
    assert step["checks"]["WebRTC barge_in_p95_ms"]["ok"] is False
    assert step["checks"]["late_frames_pct"] == {"value": 2.0, "limit": 1.0, "ok": False}
    assert step["checks"]["client_late_frames_pct"]["value"] == 0.5
    assert step["checks"]["ws_chunk_lag_p95_ms"]["ok"] is True
    assert step["ok"] is False and step["generator_overloaded"] is False

    calm = reports.step(5, ["WS"], {"WS chunk_lag": [1.0, 2.0]}, {}, {})
    assert calm["ok"] is True

    timeline = [{"t": 0.5, "server_cpu_pct": 40.0, "server_rss_mb": 120.0}]
    result = {"header": {"commit": "abc"}, "steps": [calm, step], "first_failed": 10}
    json_path, html_path = reports.write(tmp_path, {**result, "timeline": timeline})
    assert json.loads(json_path.read_text())["steps"][1]["figures"]["WebRTC barge_in"]["n"] == 100
    page = html_path.read_text()
    assert "WebRTC barge_in per step" in page and "late frames per step" in page
    assert "cpu_pct over time" in page and "FAIL" in page and "<script" not in page


def test_samples_and_clips_round_trip_through_their_files(tmp_path: Path) -> None:
    first, second = Recorder(), Recorder()
    first.time("WS", "connect", 12.5)
    second.time("WS", "connect", 7.25)
    second.count("WS answers", 2)
    first.dump(tmp_path)
    # Another Locust process's file in the same folder (a pid of its own).
    other = {"samples": {"WS connect": [3.0]}, "counters": {"WS answers": 1}}
    (tmp_path / "samples-1.json").write_text(json.dumps(other))
    second.dump(tmp_path / "other")
    samples, counters = merge(tmp_path)
    assert sorted(samples["WS connect"]) == [3.0, 12.5] and counters == {"WS answers": 1.0}
    assert merge(tmp_path / "other") == ({"WS connect": [7.25]}, {"WS answers": 2.0})
    audio = (b"\x01\x00" * 2400, b"\x02\x00" * 480)
    write_clips(tmp_path / "clips", [("WS", "hello there", audio[0]), ("WS", "bye", audio[1])])
    clips = read_clips(tmp_path / "clips")
    assert [(p, t, len(pcm)) for p, t, pcm in clips] == [
        ("WS", "hello there", 2400),
        ("WS", "bye", 480),
    ]


def test_a_chart_is_inline_svg_with_its_series() -> None:
    chart = line_chart("p95 per step", "users", "ms", {"p95": [(1, 10.0), (5, 40.0)], "p50": []})
    assert chart.startswith("<svg") and chart.count("<circle") == 2 and "p95 per step" in chart
    assert "no data" in line_chart("empty", "x", "y", {})


@pytest.mark.slow
def test_churn_mode_reports_the_servers_resources_and_redis_keys(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "loadtest.locust.run", "--churn", "6", "--churn-rounds", "2"]
    done = subprocess.run(
        cmd + ["--report", str(tmp_path)], capture_output=True, text=True, timeout=55
    )
    assert done.returncode == 0, done.stderr[-4000:]
    churn = json.loads((tmp_path / "report.json").read_text())["churn"]
    assert len(churn["rounds"]) == 2
    for resources in (churn["before"], *churn["rounds"]):
        assert resources["fds"] > 0 and resources["threads"] > 0 and resources["rss_mb"] > 20
    assert churn["rounds"][-1]["redis_keys"] <= churn["before"]["redis_keys"]  # none left
    assert isinstance(churn["flat"], bool) and "rss_growth_after_first_round_pct" in churn
    assert len(churn["redis_key_names"]["after"]) == churn["rounds"][-1]["redis_keys"]


def test_answer_gaps_record_the_widest_gap_and_the_late_frames() -> None:
    rec = Recorder()
    rec.answer_gaps("SIP", [0.0, 0.02, 0.04, 0.12, 0.14], late_gap_s=0.03)
    rec.answer_gaps("SIP", [1.0], late_gap_s=0.03)  # one frame: no gap to speak of
    assert rec.samples["SIP answer_gap"] == [80.0]
    assert rec.counters["SIP frames"] == 5 and rec.counters["SIP late_frames"] == 1
