"""The prompt-states benchmark runs and reports both encodings for each length."""

from __future__ import annotations

import json

import pytest

from loadtest import prompt_states_bench


def test_a_tiny_run_reports_both_encodings(capsys: pytest.CaptureFixture[str]) -> None:
    assert prompt_states_bench.main(["--positions", "10,1100", "--reps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["positions"] for row in rows] == [10, 1100]
    for row in rows:
        assert row["float32_mib"] == 2 * row["bf16_bits_mib"]
        assert row["float32_ms"] > 0 and row["bf16_bits_ms"] > 0
