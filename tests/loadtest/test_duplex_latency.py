"""The duplex latency benchmark runs the engine of a graph file on its own clock and
reports, per level, what a client would hear and whether the level held real time (a level
whose model fell far behind, as on a busy machine, says so rather than failing); a level
past the rows the graph holds is not run, and the report says why."""

from __future__ import annotations

from loadtest.duplex_latency import MODEL_DELAY_MS, main


def test_the_latency_benchmark_reports_each_level() -> None:
    report = main(
        ["--pipeline", "moshi_tiny", "--sessions", "1,2,5", "--seconds", "1.5", "--settle", "0.5"]
    )
    assert report["graph"]["file"] == "pipeline/configs/moshi_tiny.yaml"
    assert report["graph"]["as_shipped"] and report["rows"] == 4  # the file's rows
    assert report["levels"]["5"] == {"skipped": "the graph holds 4 sessions"}
    del report["levels"]["5"]
    assert set(report["levels"]) == {"1", "2"}
    assert report["levels"]["1"]["frames_heard"] > 0
    for level in report["levels"].values():
        lat, heard = level["latency_ms"], level["heard_by_client_ms"]
        assert set(level["phases_ms"]) <= {"rows", "encode", "step", "decode", "total"}
        if lat is None:
            assert not level["real_time"]
            continue
        assert 0 < lat["p50"] <= lat["p95"]
        assert heard["p50"] == lat["p50"] + MODEL_DELAY_MS
    assert report["most_sessions_in_real_time"] in (0, 1, 2)
