"""The interruption bench, tiny: a backchannel and a real interruption over an answer of
`parley serve --pipeline echo`, in both modes at once. Today's `always` cuts the answer for
both; `adaptive` keeps it under "yeah" and still cuts it for a longer correction (the echo
has no recogniser, so adaptive judges by the voice's length alone: short speech with no
words is kept, 700 ms of voice without a pause cuts). The report has every figure; plus the
set's sounds, made the way the bench's documentation says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from loadtest.interruption_bench import run
from loadtest.interruption_figures import table
from loadtest.interruption_set import (
    KINDS,
    RATE,
    SPEECH_DBFS,
    Case,
    Sound,
    cases,
    levelled,
    sounds,
    speakers,
)
from loadtest.voice_bench import parley_server


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with parley_server("echo") as url:
        yield url


def test_the_set_holds_every_kind_early_each_sound_levelled() -> None:
    made = sounds(("espeak-us",))
    assert {s.kind for s in made[: len(KINDS)]} == set(KINDS)
    assert [s.name for s in made if s.interrupt] == [
        "Wait, stop.",
        "No, I meant Tuesday.",
        "Yeah, but what about the price?",
    ]
    for sound in made:
        assert 150 < sound.ms < 4000, sound.name
        peak_dbfs = 20 * np.log10(np.abs(sound.pcm.astype(np.float64)).max() / 32768)
        assert SPEECH_DBFS - 12 < peak_dbfs <= 0, sound.name
    chosen = cases(made, 6, reps=2)
    assert len(chosen) == 12 and len({c.onset_ms for c in chosen}) > 2
    assert {c.snr_db for c in chosen} == {10.0, 15.0, 20.0}


async def test_a_tiny_run_reports_every_figure_in_both_modes(echo_url: str) -> None:
    say = speakers(("espeak-us",))["espeak-us"]

    def said(kind: str, text: str, interrupt: bool) -> Sound:
        return Sound(kind, text, "espeak-us", levelled(say(text), SPEECH_DBFS), interrupt)

    question = levelled(say("What will the weather be like in Boston tomorrow?"), SPEECH_DBFS)
    chosen = [
        Case(0, said("backchannel", "Yeah.", False), 300, 20.0),
        Case(1, said("interruption", "No I meant the one on Tuesday afternoon.", True), 300, 20.0),
    ]
    report = await run(echo_url, chosen, question, concurrency=4, time_limit_s=60)
    if _uncut_interruptions(report):
        # Seen once in CI (2026-12-06, recall 0.0 in one mode, never here in 23 runs under
        # a load of 3-6 busy processes): the run is taken again once, with the first run's
        # rows printed, so that a second miss fails with both runs to read.
        print("first run, an interruption not cut:", json.dumps(report["cases"]))
        report = await run(echo_url, chosen, question, concurrency=4, time_limit_s=60)
    always, adaptive = report["figures"]["always"], report["figures"]["adaptive"]
    for figures in (always, adaptive):
        assert figures["cases"] == 2 and figures["failed"] == 0, report["cases"]
        assert figures["recall"] == 1.0, report["cases"]  # the interruption cuts in both modes
        latency = figures["cut_latency"]
        assert latency["n"] == 1
        for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms"):
            assert 0 < latency[key] < 1500  # within the sender's lead and a detection
        assert set(figures["audio_lost_ms"]) == {"total", "per_wrong_cut", "per_answer"}
        assert set(figures["by_kind"]) == set(KINDS)
    assert always["precision"] == 0.5 and always["wrongly_cut_share"] == 1.0
    assert always["audio_lost_ms"]["total"] > 500  # "yeah" 300 ms into a ~3 s answer
    assert adaptive["precision"] == 1.0 and adaptive["wrongly_cut_share"] == 0.0
    assert adaptive["audio_lost_ms"]["total"] == 0
    assert report["answer_ms"]["reference"] > len(question) * 1000 / RATE
    rows = {(row["case"], row["mode"]): row for row in report["cases"]}
    assert rows[(0, "adaptive")]["cut"] is False and rows[(0, "adaptive")]["vad_heard"]
    assert rows[(1, "adaptive")]["server_heard_ms"] is not None
    assert report["server_overlap_verdicts"]["keep"] >= 1
    printed = table(report["figures"])
    assert "precision" in printed and "adaptive" in printed


def _uncut_interruptions(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for row in report["cases"] if row["interrupt"] and row["cut"] is not True]
