"""The first-audio timeline of the tiny Qwen3-Omni: every milestone, in the order it must come."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.omni_timeline import main

ORDER = [
    "thinker prompt",
    "first text",
    "thinker reply 1",
    "talker frame 1",
    "talker frame 5",
    "first audio",
]


@pytest.mark.slow
def test_the_timeline_names_each_step_to_the_first_audio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "timeline.json"
    main(
        ["--pipeline", "qwen3_omni_tiny", "--placement", "main",
         "--think-tokens", "6", "--speech-s", "1", "--audio-s", "1", "--frames", "1",
         "--concurrency", "1,2", "--reps", "1", "--out", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text())
    for level in ("c1", "c2"):
        times = [report[level][label] for label in ORDER]
        assert times == sorted(times), report[level]
        assert report[level]["talker frame gap"] > 0 and report[level]["thinker token gap"] > 0
    printed = capsys.readouterr().out
    assert "first audio" in printed  # the table is printed
    # the shipped tiny file, with the overrides asked for said where the figures are
    assert report["graph"]["file"] == "pipeline/configs/qwen3_omni_tiny.yaml"
    assert "--placement main: thinker.placement.process=main (file: worker)" in printed
