"""The decode-step benchmark's long-history part runs on the tiny model (the GPU runs it at
full size): whole rows and length buckets timed in one run, with their percentiles."""

from __future__ import annotations

import pytest

from loadtest.omni_steps import main

ARGV = ["--tiny", "--device", "cpu", "--dtype", "float32", "--parts", "histories"]


def test_histories_time_whole_rows_against_length_buckets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--max-context", "256", "--shortest-attention", "32", "--repeats", "3"]
    report = main([*ARGV, *argv, "--history-rows", "1,2", "--histories", "40,200"])
    for part in ("thinker", "talker"):
        figures = report["histories"][part]
        assert figures["lengths"] == [32, 64, 128, 256]
        assert figures["graphs"] == 0  # nothing is captured on a CPU
        for rows in (1, 2):
            short, long = figures[f"r{rows}_h40"], figures[f"r{rows}_h200"]
            assert short["attends"] == [64] and long["attends"] == [256]
            for case in (short, long):
                for way in ("whole", "bucketed"):
                    s = case[way]
                    assert s["n"] == 3 and 0 < s["p50"] <= s["p95"] <= s["p99"] <= s["max"]
                assert case["ratio_p50"] > 0
    out = capsys.readouterr().out
    assert "Thinker step at long histories" in out and "Talker step at long histories" in out
    assert out.count("ratio") == 2 * 2 * 2


def test_histories_that_do_not_fit_the_context_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main([*ARGV, "--max-context", "256", "--histories", "250"])
    assert "more than --max-context 256" in capsys.readouterr().err
