"""loadtest.omni_bench on the tiny model on this CPU: every phase's report has the figures
the H200 run needs, the table labels the published anchors, and split runs merge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loadtest.omni_bench_report import PUBLISHED, merge, table_lines

TINY = [
    "--tiny", "--device", "cpu", "--dtype", "float32", "--audio-s", "0.5", "--frames", "1",
    "--think-tokens", "2", "--speech-s", "0.8", "--first-chunk", "2", "--chunk", "4",
    "--left-context", "4", "--reps", "1", "--warmup", "0", "--kv-turns", "3", "--kv-reps", "1",
]  # fmt: skip
PERCENTILES = {"p50", "p90", "p95", "p99", "min", "max", "mean", "n"}


def bench(out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    command = [sys.executable, "-m", "loadtest.omni_bench", *TINY, *extra, "--out", str(out)]
    # ~25 s alone; far longer on a busy 2-core machine
    done = subprocess.run(command, capture_output=True, text=True, timeout=140)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_tiny_bench_reports_every_level_and_phase(tmp_path: Path) -> None:
    report, printed = bench(
        tmp_path / "bench.json",
        "--concurrency", "1,2", "--phases", "parley,kv_reuse,code2wav",
    )  # fmt: skip
    head = report["header"]
    for key in ("commit", "torch", "transformers", "graph", "input", "lengths", "concurrency"):
        assert head[key], key
    assert head["concurrency"] == [1, 2] and head["warmup_requests"] == 0
    assert "qwen3_omni.talker" in head["graph"]

    parley = report["parley"]
    assert "error" not in parley and parley["start_s"] > 0
    for level in (1, 2):
        row = parley[f"c{level}"]
        assert row["requests"] == level and row["error_count"] == 0
        for key in ("first_audio_ms", "first_text_ms", "rtf", "thinker_tokens_per_s",
                    "talker_frames_per_s", "audio_chunk_gap_ms", "playback_stall_ms"):  # fmt: skip
            assert set(row[key]) == PERCENTILES, key
            assert row[key]["n"] >= level, key
        assert row["thinker_tokens_per_s_aggregate"]["n"] == 1  # one round
        assert row["talker_frames_per_s_aggregate"]["p50"] > 0
        assert row["first_text_ms"]["p50"] < row["first_audio_ms"]["p50"]
        assert row["audio_s"]["p50"] > 0.5  # 0.8 s of speech (10 frames)
        assert "peak_gpu_used_gib" in row  # None on a CPU
    assert parley["peak_gpu_used_gib"] is None

    kv = report["kv_reuse"]
    assert kv["mechanism"] in ("session_kv", "prefix_cache")
    for turn in ("turn2", "turn3"):
        on, off = kv[turn]["reuse_on"], kv[turn]["reuse_off"]
        assert on["prefill_ms"]["n"] == off["prefill_ms"]["n"] == 1
        assert on["prefilled_tokens"]["p50"] <= off["prefilled_tokens"]["p50"]
    # the third turn reuses its first exchange with either mechanism
    on, off = kv["turn3"]["reuse_on"], kv["turn3"]["reuse_off"]
    assert on["prefilled_tokens"]["p50"] < off["prefilled_tokens"]["p50"]
    assert kv["turn3"]["turns_reused"] == 1

    code2wav = report["code2wav"]
    for level in (1, 2):
        row = code2wav[f"c{level}"]
        assert row["first_chunk_ms"]["n"] == level
        assert row["chunk_ms"]["n"] == 2 * level  # 10 frames: 2, then two chunks of 4

    assert PUBLISHED in printed and "parley (measured)" in printed
    assert "Follow-up turn prefill" in printed and "Code2Wav time per chunk" in printed


def test_split_runs_merge_into_one_table() -> None:
    level = {
        "requests": 1,
        "first_audio_ms": {"p50": 900.0, "p95": 950.0},
        "rtf": {"p50": 1.5},
        "playback_stall_ms": {"p50": 37.0, "p95": 412.0},
    }
    first = {"header": {"commit": "abc"}, "parley": {"c1": level, "c4": level}}
    second = {
        "header": {"commit": "abc"},
        "parley": {"c10": {**level, "first_audio_ms": {"p50": 2000.0, "p95": 2100.0}}},
        "baseline": {"c1": {**level, "first_audio_ms": {"p50": 12400.0, "p95": 12500.0}}},
    }
    merged = merge([first, second])
    assert merged["same_commit"] and len(merged["headers"]) == 2
    assert sorted(merged["parley"]) == ["c1", "c10", "c4"]
    assert merged["parley"]["c10"]["header_index"] == 1
    lines = "\n".join(table_lines(merged))
    rows = [line for line in lines.splitlines() if "(measured)" in line]
    assert [row.split()[2] for row in rows] == ["1", "4", "10", "1"]  # parley by level, baseline
    assert "12400" in lines and "1629" in lines  # measured and published side by side
    assert all(row.split()[-3:] == ["37", "/", "412"] for row in rows)  # stall p50 / p95


def test_playback_stalls_count_only_the_waits_after_the_first_chunk() -> None:
    from loadtest.omni_bench_report import playback_stall_s

    assert playback_stall_s([]) == 0.0
    # 0.4 s playing while the next arrives at 0.2 s: no wait
    assert playback_stall_s([(1.0, 0.4), (1.2, 2.0)]) == 0.0
    # the next arrives 0.6 s after the first has played out, the third in time
    assert abs(playback_stall_s([(1.0, 0.4), (2.0, 2.0), (3.0, 2.0)]) - 0.6) < 1e-9


@pytest.mark.parametrize(
    ("layout", "thinker", "audio"),
    [
        ("one", ["cuda:0"], ["cuda:0"]),
        ("split", ["cuda:0"], ["cuda:1"]),
        ("replicas", ["cuda:0", "cuda:1"], ["cuda:1"]),
    ],
)
def test_each_layout_places_the_stages_on_their_gpus(
    layout: str, thinker: list[str], audio: list[str]
) -> None:
    from loadtest.omni_bench import graph_yaml
    from loadtest.omni_bench_options import parser
    from pipeline.graph_config import parse_graph

    args = parser().parse_args(["--layout", layout])
    graph = parse_graph(graph_yaml(args))
    assert list(graph.stage("thinker").devices) == thinker
    assert list(graph.stage("talker").devices) == audio
    assert list(graph.stage("code2wav").devices) == audio
    assert "device" not in graph.stage("thinker").engine_args  # the placement says it


def test_the_layouts_asked_for_are_checked_and_reported_apart() -> None:
    from loadtest.omni_bench import phase_name
    from loadtest.omni_bench_options import parser

    assert parser().parse_args(["--layouts", "one,split,replicas"]).layouts == [
        "one",
        "split",
        "replicas",
    ]
    with pytest.raises(SystemExit):
        parser().parse_args(["--layouts", "one,three"])
    assert [phase_name("parley", x) for x in ("one", "split")] == ["parley", "parley_split"]
    assert phase_name("baseline", "one") == "baseline"
    report = {
        "parley": {"c1": {"first_audio_ms": {"p50": 500.0, "p95": 600.0}}},
        "parley_split": {"c1": {"first_audio_ms": {"p50": 400.0, "p95": 450.0}}},
    }
    rows = [line for line in table_lines(report) if "(measured)" in line]
    assert [row.split()[0] for row in rows] == ["parley", "parley_split"]


def test_a_phase_on_two_gpus_counts_the_memory_of_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU here: a stand-in `nvidia-smi` on PATH answers as the real one does, a line of
    MiB per GPU asked for with --id."""
    from loadtest.omni_bench import phase_devices
    from loadtest.omni_bench_gpu import GpuMemoryPoller, gpu_memory_gib
    from loadtest.omni_bench_options import parser

    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in --id=*) ids="${a#--id=}";; esac; done\n'
        'for i in $(echo "$ids" | tr , " "); do echo $(( (i + 1) * 1024 )); done\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert gpu_memory_gib(1) == 2.0
    assert gpu_memory_gib([0, 1]) == 3.0
    args = parser().parse_args([])
    assert phase_devices(args, "one") == ["cuda:0"]
    assert phase_devices(args, "replicas") == ["cuda:0", "cuda:1"]
    with GpuMemoryPoller(["cuda:0", "cuda:1", "cpu"], interval_s=0.01) as memory:
        assert memory.indices == [0, 1]
        deadline = time.monotonic() + 10
        while memory.peak() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert memory.peak() == 3.0
