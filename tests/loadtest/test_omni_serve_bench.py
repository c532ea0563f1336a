"""The serve benchmark end to end on the tiny Qwen3-Omni graph: a real `parley serve` in a
child process, two levels of WebSocket clients speaking questions; every request heard
audio, and the report holds the figures the GPU run is read for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest import omni_serve_bench


@pytest.mark.timeout(120)
def test_tiny_graph_at_one_and_two_sessions(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    argv = ["--pipeline", "qwen3_omni_tiny", "--concurrency", "1,2", "--warmup", "0"]
    argv += ["--think-tokens", "4", "--speech-s", "0.4", "--start-s", "60"]
    assert omni_serve_bench.main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["header"]["server_start_s"] > 0
    assert "max_new_tokens: 4" in report["header"]["graph"]
    levels = report["levels"]
    assert [level["sessions"] for level in levels] == [1, 2]
    for level in levels:
        figures = level["figures"]
        assert figures["requests"] == figures["with_audio"] == level["sessions"]
        assert figures["error_count"] == 0
        assert figures["first_audio_ms"]["p50"] > figures["speech_stopped_ms_p50"] > 0
        assert figures["graph_first_chunk_ms_mean"]["code2wav"] > 0
        assert figures["session_share_ms"] is not None
        for request in level["requests"]:
            assert request["audio_s"] > 0.2 and request["status"] == "completed"
