"""The peer comparison's parts that need no peer installed: the runner's arguments, the
table's ratios on canned results, the barge-in and late-frame arithmetic, the bots' reply,
and the Parley side of the client end to end (`parley serve --pipeline echo`, one call,
one turn), which is how CI knows the runner still works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtest.peers import probe
from loadtest.peers.bots.reply import HIGH_HZ, LOW_HZ, RATE, pieces, sweep
from loadtest.peers.capacity import step_ok
from loadtest.peers.measures import old_answer_end
from loadtest.peers.report import figures, ratio, table
from loadtest.peers.run import QUICK, parse

ROOT = Path(__file__).resolve().parents[2]


def test_arguments_default_to_every_peer_and_test_with_full_counts() -> None:
    args = parse([])
    assert args.peer == ["parley", "fastrtc", "pipecat"]
    assert args.tests == ["connect", "turn", "barge", "capacity"]
    assert args.connect == 10 and args.steps == (1, 5, 10, 15, 20, 30)


def test_quick_counts_yield_to_explicit_ones() -> None:
    args = parse(["--peer", "pipecat", "--tests", "turn", "--quick", "--turn", "7"])
    assert args.peer == ["pipecat"] and args.tests == ["turn"]
    assert args.turn == 7 and args.barge == QUICK["barge"] and args.steps == (1, 3)


@pytest.mark.parametrize("bad", [["--peer", "livekit"], ["--tests", "connect,leak"]])
def test_unknown_peers_and_tests_are_refused(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse(bad)


def canned() -> dict[str, dict[str, object]]:
    one = {"calls": 1, "ok": True, "server_cpu_pct": 12.0}
    parley = {
        "connect_ms": [60.0, 62.0, 64.0],
        "turn_ms": [500.0] * 19 + [900.0],
        "barge": {"barge_ms": [100.0, 120.0, 140.0], "not_interrupted": 0},
        "capacity": {"steps": [one, {"calls": 5, "ok": False}], "max_ok_calls": 1},
    }
    fastrtc = {
        "connect_ms": [138.0, 140.0, 142.0],
        "turn_ms": [1000.0] * 20,
        "barge": {"barge_ms": [1500.0, 1500.0, 1500.0], "not_interrupted": 3},
        "capacity": {
            "steps": [{"calls": 1, "ok": False, "server_cpu_pct": 90.0}],
            "max_ok_calls": 0,
        },
    }
    return {"parley": figures(parley), "fastrtc": figures(fastrtc)}


def test_figures_take_percentiles_the_largest_step_that_held_and_cpu_at_one_call() -> None:
    results = canned()
    assert results["parley"]["connect_p50_ms"] == 62.0
    assert results["parley"]["turn_p50_ms"] == 500.0
    assert results["parley"]["turn_p95_ms"] == 520.0  # numpy's linear interpolation
    assert results["parley"]["max_ok_calls"] == 1
    assert results["parley"]["cpu_1_call_pct"] == 12.0
    assert results["fastrtc"]["cpu_1_call_pct"] == 90.0
    assert results["fastrtc"]["not_interrupted"] == 3


def test_table_gives_each_peer_as_a_ratio_to_parley_of_the_same_run() -> None:
    text = table(canned())
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if "|" in line}
    assert "fastrtc / Parley" in rows["metric"]
    assert "| 62 ms | 140 ms | 2.26x |" in rows["connect p50"]
    assert "| 500 ms | 1000 ms | 2.00x |" in rows["turn latency p50"]
    assert "| 1 | 0 | 0.00x |" in rows["calls held (< 1 % late)"]
    assert "| 12.0 % | 90.0 % | 7.50x |" in rows["server CPU, 1 call"]
    assert "FastRTC 0.0.34: 3 barge-in tries not cut short" in text


def test_a_ratio_needs_both_figures() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(3.0, None) is None and ratio(3.0, 0.0) is None


def test_the_old_answer_ends_at_the_first_gap_or_its_natural_end() -> None:
    loud, quiet = 1000.0, 10.0
    frames = [(1.0 + 0.02 * k, loud) for k in range(10)]  # 1.00 .. 1.18: the old answer
    frames += [(1.2 + 0.02 * k, quiet) for k in range(20)]  # 400 ms of quiet
    frames += [(1.6 + 0.02 * k, loud) for k in range(10)]  # the next answer
    assert old_answer_end(frames, since=1.05, until=9.0) == pytest.approx(1.18)
    # no gap at all: the natural end bounds it
    solid = [(1.0 + 0.02 * k, loud) for k in range(100)]
    assert old_answer_end(solid, since=1.05, until=1.5) == pytest.approx(1.5, abs=0.021)
    assert old_answer_end(frames, since=5.0, until=9.0) is None


def test_a_step_holds_only_when_every_call_connected_and_answered_under_one_percent_late() -> None:
    good = {"calls": 3, "connected": 3, "late_pct": 0.4, "answered_calls": 3}
    assert step_ok(good)
    assert not step_ok(good | {"late_pct": 1.0})
    assert not step_ok(good | {"connected": 2})
    assert not step_ok(good | {"answered_calls": 2})


def test_the_probe_counts_a_frame_late_against_the_best_schedule_of_its_talkspurt() -> None:
    clock = probe.FrameClock()
    for k in range(5):
        clock.stamp(1, 10.0 + 0.02 * k)
    clock.stamp(1, 10.0 + 0.02 * 5 + 0.045)  # 45 ms behind its slot: late
    clock.stamp(1, 10.0 + 0.02 * 6 + 0.030)  # 30 ms behind: not late
    clock.stamp(2, 10.0)  # another sender has a schedule of its own
    clock.stamp(1, 20.0)  # after a gap: a new talkspurt, on time
    shot = clock.snapshot(reset=True)
    assert (shot["frames"], shot["late"], shot["max_late_ms"], shot["senders"]) == (9, 1, 45.0, 2)
    assert clock.snapshot(reset=False)["frames"] == 0


def test_the_bots_reply_is_a_rising_sweep_of_the_asked_length_in_100_ms_pieces() -> None:
    pcm = sweep(2.0)
    assert len(pcm) == 2 * RATE and pcm.dtype == np.int16
    parts = pieces(pcm)
    assert len(parts) == 20 and all(len(p) == RATE // 10 for p in parts)

    def pitch(chunk: np.ndarray) -> float:
        spectrum = np.abs(np.fft.rfft(chunk.astype(np.float64)))
        return float(np.argmax(spectrum) * RATE / len(chunk))

    first, last = pitch(parts[0]), pitch(parts[-1])
    assert LOW_HZ - 60 <= first < last <= HIGH_HZ + 60


@pytest.mark.slow
def test_the_runner_measures_parley_connect_and_turn(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "loadtest.peers.run", "--peer", "parley"]
    cmd += ["--tests", "connect,turn", "--connect", "1", "--turn", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=55)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "parley.json").read_text())
    assert len(record["raw"]["connect_ms"]) == 1 and len(record["raw"]["turn_ms"]) == 1
    assert 0 < record["figures"]["connect_p50_ms"] < 5_000
    assert 0 < record["figures"]["turn_p50_ms"] < 5_000
    assert "| connect p50 |" in (tmp_path / "table.md").read_text()


def test_vllm_omni_gets_the_same_arrays_as_our_connector_in_its_own_payload_shape() -> None:
    from loadtest import connector_bench
    from loadtest.peers.omni_connector import omni_payload

    hidden = omni_payload("t2t_hidden")
    assert tuple(hidden["hidden_states"]["output"].shape) == (200, 3584)
    ours = connector_bench.bulk(connector_bench.payload("t2t_hidden"))
    assert np.array_equal(hidden["hidden_states"]["output"].numpy(), ours)
    assert omni_payload("t2v_codes")["codes"]["audio"].numel() == 600


def test_without_vllm_omni_installed_the_stub_says_how_to_install_it(tmp_path: Path) -> None:
    code = "from loadtest.peers import omni_stub; omni_stub.install()"
    env = {**os.environ, "PEERS_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert "python -m loadtest.peers.setup omni" in done.stderr
