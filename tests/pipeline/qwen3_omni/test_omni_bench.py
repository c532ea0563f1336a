"""loadtest.omni_bench on the tiny graph file on this CPU: every phase's report has the
figures the GPU run needs and says which graph it measured (the file, and each override
beside the figures it touches); the baseline is a finished answer, not a first audio; the
published figures carry their hardware and workload; split runs merge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loadtest.omni_bench_report import merge, table_lines

TINY = [
    "--pipeline", "qwen3_omni_tiny", "--audio-s", "0.5", "--frames", "1",
    "--think-tokens", "2", "--speech-s", "0.8", "--set", "code2wav.first_chunk=2",
    "--set", "code2wav.chunk=4", "--set", "code2wav.left_context=4",
    "--reps", "1", "--warmup", "0", "--kv-turns", "3", "--kv-reps", "1",
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
    for key in ("commit", "torch", "transformers", "graph", "input", "concurrency"):
        assert head[key], key
    assert head["concurrency"] == [1, 2] and head["warmup_requests"] == 0
    graph = head["graph"]
    assert graph["file"] == "pipeline/configs/qwen3_omni_tiny.yaml" and not graph["as_shipped"]
    assert "code2wav.chunk=4 (file: 25) (--set code2wav.chunk=4)" in graph["overrides"]
    assert "talker.max_frames=10 (file: 50) (--speech-s 0.8)" in graph["overrides"]
    # the file's settings stand where nothing overrides them: its context, its rows
    assert "max_context: 4096" in graph["graph"] and "decode_rows: 8" in graph["graph"]
    assert "override: thinker.max_new_tokens=2 (file: 24) (--think-tokens 2)" in printed

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
    assert "code2wav.chunk=4" in parley["graph_note"]  # every stage's overrides, beside it

    kv = report["kv_reuse"]
    assert kv["mechanism"] == "session_kv" and kv["engine_args"]["session_kv_tokens"] == 8192
    assert "thinker.max_new_tokens=2" in kv["graph_note"] and "code2wav" not in kv["graph_note"]
    for turn in ("turn2", "turn3"):
        on, off = kv[turn]["reuse_on"], kv[turn]["reuse_off"]
        assert on["prefill_ms"]["n"] == off["prefill_ms"]["n"] == 1
        assert on["prefilled_tokens"]["p50"] <= off["prefilled_tokens"]["p50"]
    # the third turn reuses its first exchange with either mechanism
    on, off = kv["turn3"]["reuse_on"], kv["turn3"]["reuse_off"]
    assert on["prefilled_tokens"]["p50"] < off["prefilled_tokens"]["p50"]
    assert kv["turn3"]["turns_reused"] == 1

    code2wav = report["code2wav"]
    assert code2wav["max_batch"] == 8  # the engine's own (the file sets none), not the level's
    for level in (1, 2):
        row = code2wav[f"c{level}"]
        assert row["first_chunk_ms"]["n"] == level
        assert row["chunk_ms"]["n"] == 2 * level  # 10 frames: 2, then two chunks of 4

    assert "3x H100" in printed and "2,500 tokens in, 900 out" in printed
    assert "parley (measured)" in printed and "graph: pipeline/configs/qwen3_omni_tiny" in printed
    assert "Follow-up turn prefill" in printed and "Code2Wav time per chunk" in printed


def test_split_runs_merge_into_one_table() -> None:
    level = {
        "requests": 1,
        "first_audio_ms": {"p50": 900.0, "p95": 950.0, "mean": 910.0},
        "total_s": {"p50": 2.2, "p95": 2.3},
        "rtf": {"p50": 1.5},
        "playback_stall_ms": {"p50": 37.0, "p95": 412.0},
    }
    first = {"header": {"commit": "abc"}, "parley": {"c1": level, "c4": level}}
    second = {
        "header": {"commit": "abc"},
        "parley": {"c10": {**level, "first_audio_ms": {"p50": 2000.0, "p95": 2100.0}}},
        "baseline": {
            "c1": {"requests": 2, "finished_answer_ms": {"p50": 12400.0, "p95": 12500.0}},
            "graph_note": "pipeline/configs/qwen3_omni.yaml with --think-tokens 128: ...",
        },
    }
    merged = merge([first, second])
    assert merged["same_commit"] and len(merged["headers"]) == 2
    assert sorted(merged["parley"]) == ["c1", "c10", "c4"]
    assert merged["parley"]["c10"]["header_index"] == 1
    lines = "\n".join(table_lines(merged))
    rows = [line for line in lines.splitlines() if "(measured)" in line]
    assert [row.split()[2] for row in rows] == ["1", "4", "10"]  # parley by level
    assert all(row.split()[-3:] == ["37", "/", "412"] for row in rows)  # stall p50 / p95
    # the baseline is its finished answer, beside Parley's own finished answer, never
    # beside a first audio
    (theirs,) = [line for line in lines.splitlines() if line.startswith("  transformers:")]
    (ours,) = [line for line in lines.splitlines() if line.startswith("  Parley:")]
    assert theirs.split()[1:4] == ["12400", "/", "12500"] and "first audio" not in theirs
    assert ours.split()[1:4] == ["2200", "/", "2300"]
    assert "time to its finished answer" in lines and "--think-tokens 128" in lines
    # published figures, each with its hardware and workload
    assert "3x H100 (the Thinker on one GPU; two Talker and two Code2Wav replicas)" in lines
    assert "2,500 tokens in, 900 out: mean time to first audio 325 ms at 8" in lines
    assert "2x H800" in lines and "1,629 ms at 10" in lines


def test_the_benchmark_reads_the_shipped_graph_and_says_each_override() -> None:
    """Issue 41: the bench once wrote a graph of its own (one max_context for both stages,
    Code2Wav batched as the level, no session KV). Now the file's settings stand, and what
    the command changes is written down, with the file's value, beside what it touches."""
    from loadtest.omni_bench_options import parser
    from loadtest.omni_graph import omni_graph
    from pipeline.graph_config import GraphConfigError

    graph = omni_graph(parser().parse_args([]))
    assert graph.report()["as_shipped"] and graph.note() == (
        "pipeline/configs/qwen3_omni.yaml as shipped"
    )
    assert graph.engine_args("thinker")["max_context"] == 8192
    assert graph.engine_args("talker")["max_context"] == 4096
    assert graph.engine_args("thinker")["session_kv_tokens"] == "auto"
    assert "max_batch" not in graph.engine_args("code2wav")

    argv = ["--think-tokens", "128", "--set", "code2wav.max_batch=32", "--device", "cuda:1"]
    graph = omni_graph(parser().parse_args(argv))
    assert graph.devices("thinker") == graph.devices("code2wav") == ["cuda:1"]
    assert (
        "code2wav.max_batch=32 (file: unset) (--set code2wav.max_batch=32)"
        in (graph.report()["overrides"])
    )
    assert "code2wav.max_batch" not in graph.note("thinker")
    assert "thinker.max_new_tokens=128 (file: 512)" in graph.note("thinker")
    with pytest.raises(SystemExit, match="no stage 'vocoder'"):
        omni_graph(parser().parse_args(["--set", "vocoder.max_batch=2"]))
    # an override that contradicts the file's limits is refused as the server would
    with pytest.raises(GraphConfigError, match="max_new_tokens"):
        omni_graph(parser().parse_args(["--think-tokens", "9000"]))


def test_playback_stalls_count_only_the_waits_after_the_first_chunk() -> None:
    from loadtest.omni_bench_report import playback_stall_s

    assert playback_stall_s([]) == 0.0
    # 0.4 s playing while the next arrives at 0.2 s: no wait
    assert playback_stall_s([(1.0, 0.4), (1.2, 2.0)]) == 0.0
    # the next arrives 0.6 s after the first has played out, the third in time
    assert abs(playback_stall_s([(1.0, 0.4), (2.0, 2.0), (3.0, 2.0)]) - 0.6) < 1e-9


REPLICA_SIZING = [
    "--set", "thinker.decode_rows=16", "--set", "thinker.prefix_cache_tokens=4096",
    "--set", "thinker.session_kv_tokens=16384",
    "--set", "talker.shares_gpu_with=[thinker, code2wav]",
]  # fmt: skip
"""The file sizes its Thinker for a GPU of its own: replicas need sizes of their own."""


@pytest.mark.parametrize(
    ("layout", "extra", "thinker", "audio"),
    [
        ("file", [], ["cuda:0"], ["cuda:1"]),
        ("split", [], ["cuda:0"], ["cuda:1"]),
        ("replicas", REPLICA_SIZING, ["cuda:0", "cuda:1"], ["cuda:1"]),
    ],
)
def test_each_layout_places_the_stages_on_their_gpus(
    layout: str, extra: list[str], thinker: list[str], audio: list[str]
) -> None:
    from loadtest.omni_bench_options import parser
    from loadtest.omni_graph import omni_graph
    from pipeline.graph_config import parse_graph

    args = parser().parse_args(["--pipeline", "qwen3_omni_2gpu", "--layout", layout, *extra])
    graph = omni_graph(args, layout)
    config = parse_graph(graph.text())
    assert list(config.stage("thinker").devices) == thinker
    assert list(config.stage("talker").devices) == audio
    assert list(config.stage("code2wav").devices) == audio
    # the shipped two-GPU file is the split layout already: only replicas change it
    assert ("--layouts replicas" in graph.note()) == (layout == "replicas")


def test_a_layout_the_file_is_not_sized_for_is_refused() -> None:
    from loadtest.omni_bench_options import parser
    from loadtest.omni_graph import omni_graph
    from pipeline.graph_config import GraphConfigError

    with pytest.raises(GraphConfigError, match="shares_gpu_with"):
        omni_graph(parser().parse_args(["--layout", "split"]), "split")


def test_the_layouts_asked_for_are_checked_and_reported_apart() -> None:
    from loadtest.omni_bench import phase_name
    from loadtest.omni_bench_options import parser

    assert parser().parse_args(["--layouts", "file,split,replicas"]).layouts == [
        "file",
        "split",
        "replicas",
    ]
    with pytest.raises(SystemExit):
        parser().parse_args(["--layouts", "file,three"])
    assert [phase_name("parley", x) for x in ("file", "split")] == ["parley", "parley_split"]
    assert phase_name("baseline", "file") == "baseline"
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
    from loadtest.omni_bench_gpu import GpuMemoryPoller, gpu_memory_gib
    from loadtest.omni_bench_options import parser
    from loadtest.omni_graph import phase_devices

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
    assert phase_devices(parser().parse_args([]), "file") == ["cuda:0"]
    two = parser().parse_args(["--pipeline", "qwen3_omni_2gpu", *REPLICA_SIZING])
    assert phase_devices(two, "replicas") == ["cuda:0", "cuda:1"]
    with GpuMemoryPoller(["cuda:0", "cuda:1", "cpu"], interval_s=0.01) as memory:
        assert memory.indices == [0, 1]
        deadline = time.monotonic() + 10
        while memory.peak() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert memory.peak() == 3.0
