"""The SIP benchmark end to end on a tiny step: sipp and a probe call hold two calls on
`parley serve --pipeline echo --sip-port`, and a barge-in trial over RTP; the report has
every figure. Plus its parts on fixed inputs: sipp's scenario and statistics, the probe's
count of late packets."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from loadtest.sip_bench import run, table
from loadtest.sip_probe import Probe
from loadtest.sip_sipp import _counts, scenario
from tests.realtime.sip.support import requires_sipp

STEP_FIGURES = {
    "calls",
    "sipp_calls",
    "probe_calls",
    "ramp_s",
    "answered",
    "sipp_failed",
    "probe_packets",
    "probe_packets_expected",
    "probe_audible_pct",
    "late_packets_pct",
    "gap_p99_ms",
    "gap_max_ms",
    "server_loop_runqueue_wait_pct",
    "server_loop_cpu_pct",
    "server_cpu_pct",
    "sipp_cpu_pct",
    "loop_lag_max_ms",
    "loop_lag_p99_ms",
    "load_average_1m",
}


def test_the_scenario_streams_speech_while_held_and_hangs_up() -> None:
    root = ET.fromstring(scenario(2.5))
    steps = [(el.tag, el.attrib) for el in root]
    assert [tag for tag, _ in steps].count("send") == 3  # INVITE, ACK, BYE
    assert ("pause", {"milliseconds": "2500"}) in steps
    text = scenario(1)
    assert 'rtp_stream="speech.wav,-1,0"' in text
    assert text.index("INVITE sip:") < text.index("ACK sip:") < text.index("BYE sip:")


def test_sipp_statistics_give_the_last_counts(tmp_path: Path) -> None:
    stats = tmp_path / "s.csv"
    assert _counts(stats) == (0, 0)
    stats.write_text("StartTime;SuccessfulCall(C);FailedCall(C);\nx;0;0;\ny;7;1;\n")
    assert _counts(stats) == (7, 1)


def test_gaps_over_30_ms_count_as_late() -> None:
    probe = Probe(("127.0.0.1", 5060))
    probe.arrivals = [0.0, 0.02, 0.04, 0.1, 0.12, 0.155]
    probe.loud = [False, True, True, False, True, False]
    assert probe.late_gaps() == (2, 6)
    assert probe.late_gaps(since=0.1) == (1, 3)
    assert probe.loud_times(since=0.03) == [0.04, 0.12]
    assert probe.gaps(since=0.1) == pytest.approx([0.02, 0.035])


@requires_sipp
@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_tiny_step_and_a_barge_in_report_every_figure(tmp_path: Path) -> None:
    report = await run([2], seconds=6.0, probes=1, trials=1, work=tmp_path)
    (step,) = report["steps"]
    assert set(step) == STEP_FIGURES
    assert step["answered"] == 2 and step["sipp_calls"] == 1 and step["sipp_failed"] == 0
    # ~5 s measured of 20 ms packets, and the echo answered the probe's speech with audio
    assert step["probe_packets"] > 0.8 * step["probe_packets_expected"]
    assert step["probe_audible_pct"] > 0
    assert 0 <= step["late_packets_pct"] < 20
    assert step["server_cpu_pct"] > 0
    barge = report["barge_in"]
    assert barge["trials"] == 1 and len(barge["barge_in_ms"]) == 1
    assert 0 < barge["barge_in_p50_ms"] < 1000  # the old answer stops within the interruption
    text = table(report)
    assert "late_packets_pct" in text and "barge-in over RTP" in text
