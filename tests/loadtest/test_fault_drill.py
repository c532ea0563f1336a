"""The fault drill end to end on the tiny Qwen3-Omni graph: a real `parley serve` in a child
process, a sticky device error injected into the Talker (a stream stage in a worker process)
mid-answer; the client is told `model_error`, `/readyz` goes red and comes back, a new session
is served, and nothing the drill started is left running."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from loadtest import fault_drill
from loadtest.proc_cpu import cmdline, start_ticks, tree


def _ticks_since_boot() -> int:
    """Now, in clock ticks since boot. A process left behind is one started after the drill
    began: /proc's children lists can miss a child while threads come and go, so comparing
    two listings once took an older one for new."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_talker_fault_is_told_and_the_service_comes_back(tmp_path: Path) -> None:
    out = tmp_path / "drill.json"
    started = _ticks_since_boot()
    argv = ["--pipeline", "qwen3_omni_tiny", "--faults", "talker", "--out", str(out)]
    code = fault_drill.main([*argv, "--wait-s", "120", "--ready-timeout-s", "240"])
    left = [pid for pid in tree(os.getpid()) if start_ticks(pid) > started]
    assert not left, [cmdline(pid) for pid in left]  # the server and its workers are gone
    report = json.loads(out.read_text())
    assert report["pipeline"] == "qwen3_omni_tiny" and report["source"]["commit"]
    assert report["server"]["start_s"] > 0
    assert any("session cap" in line for line in report["server"]["starts"][0]["capacity_lines"])
    assert (tmp_path / "drill.log").stat().st_size > 0
    (result,) = report["faults"]
    assert result["fired"] and result["told"] == "model_error", result
    assert result["told_s"] < 30 and result["red_s"] is not None, result
    assert result["back_s"] is not None and result["new_session_delta_s"] is not None, result
    assert result["new_session_delta_s"] >= result["back_s"] > result["red_s"]
    assert result["verdict"]["red_seen"] and result["verdict"]["new_session_served"]
    assert code == (0 if all(result["verdict"].values()) else 1)
