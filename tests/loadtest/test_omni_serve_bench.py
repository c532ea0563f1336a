"""The serve benchmark end to end on the tiny Qwen3-Omni graph: a real `parley serve` in a
child process, a level of WebSocket clients asking at once, then sessions arriving on their
own (Poisson) with questions and answers of different lengths, some with camera frames;
every request heard audio, and the report holds the figures the GPU run is read for, with
the graph file and each override it was served with."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest

from loadtest import omni_serve_bench
from loadtest.omni_arrivals import ArrivalSettings, plan
from loadtest.omni_serve_client import Refused, Request, failed_session
from loadtest.serve_figures import distribution, request_figures, row


@pytest.mark.timeout(150)
def test_tiny_graph_in_rounds_and_under_arrivals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its folder (server log): here
    out = tmp_path / "report.json"
    argv = ["--pipeline", "qwen3_omni_tiny", "--concurrency", "2", "--warmup", "0"]
    argv += ["--think-tokens", "8", "--speech-s", "1", "--start-s", "90"]
    argv += ["--arrivals", "3", "--arrival-requests", "4", "--question-s", "1.5,3", "--seed", "1"]
    argv += ["--whole-turns", "0.5", "--log-level", "info"]
    assert omni_serve_bench.main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    head = report["header"]
    assert head["server_start_s"] > 0
    assert head["gpu_memory_gib"] == {}  # no process started CUDA here (the GPU run's figures)
    phases = head["turn_phases"]  # each turn's phases by stage, read from the server's log
    assert phases["thinker"]["turns"] == phases["talker"]["turns"] == 6
    assert phases["thinker"]["in_all"]["p50"] > 0 and phases["thinker"]["towers"]["n"] == 6
    assert phases["talker"]["first_frame"]["p50"] > 0 and phases["talker"]["positions"]["n"] == 6
    assert "talker turns (6), p50: prompt=" in printed  # the run's last lines say them

    # the shipped file, served with the overrides asked for, each one said
    graph = head["graph"]
    assert graph["file"] == "pipeline/configs/qwen3_omni_tiny.yaml" and graph["shipped"]
    assert not graph["as_shipped"]
    assert "thinker.max_new_tokens=8 (file: 24) (--think-tokens 8)" in graph["overrides"]
    assert "talker.max_frames=12 (file: 50) (--speech-s 1)" in graph["overrides"]
    assert "max_new_tokens: 8" in graph["graph"] and "session_kv_tokens: 8192" in graph["graph"]
    assert "override: thinker.max_new_tokens=8" in printed

    (level,) = report["levels"]
    figures = level["figures"]
    assert figures["requests"] == figures["with_audio"] == 2 and figures["error_count"] == 0
    after_stop = figures["first_audio_after_stop_ms"]
    assert after_stop["n"] == 2 and 0 < after_stop["p50"] <= after_stop["max"]
    assert after_stop["p99"] is None and after_stop["p99_left_out"] == "n = 2 < 100"
    assert figures["rtf_heard"]["p50"] >= 1.0
    assert figures["graph_first_chunk_ms_mean"]["code2wav"] > 0
    assert figures["session_share_ms"] is not None

    (arrivals,) = report["arrivals"]
    assert arrivals["target_sessions"] == 3 and arrivals["sessions_started"] == 4
    assert arrivals["rate_per_s"] == pytest.approx(3 / arrivals["expected_session_s"], rel=1e-3)
    assert arrivals["mean_sessions"] > 0 and arrivals["most_sessions"] >= 1
    assert arrivals["figures"]["error_count"] == 0 and arrivals["figures"]["with_audio"] == 4
    # the plan is the seed's: the same questions and answer caps on every run
    settings = ArrivalSettings(4, 600.0, (1.5, 3.0), (2, 8), 0.5, seed=1, whole_turns=0.5)
    planned = plan(3, arrivals["rate_per_s"], settings, questions=4)
    requests = sorted(arrivals["requests"], key=lambda r: r["client"])
    assert [r["answer_tokens"] for r in requests] == [a.answer_tokens for a in planned]
    assert [r["speech_s"] for r in requests] == [round(a.question_s, 1) for a in planned]
    # answers as long as their caps: the Talker speaks 12 / 7 frames a reply token fed (a
    # whole answer: 7 fed, 12 frames, as long as the rounds' answers)
    frame_s = figures["audio_s"]["p50"] / 12
    for r in requests:
        assert r["status"] == "completed"
        frames = min(12, math.ceil(round(12 / 7, 4) * (r["answer_tokens"] - 1)))
        assert r["audio_s"] == pytest.approx(frame_s * frames, abs=0.06), r  # (0.1 s rounding)
    # the mixed-modality set: half sent camera frames while speaking, reported apart
    framed = [r for r in requests if r["frames_sent"]]
    assert len(framed) == 2 == arrivals["audio_with_frames"]["requests"]
    assert arrivals["audio_only"]["requests"] == 2
    # the baseline in the same run: half committed by hand (taken whole), half streamed in
    # while spoken; each whole turn's first audio counted from its commit
    whole = {a.index for a in planned if a.whole_turn}
    assert len(whole) == 2 == arrivals["whole_turn"]["first_audio_after_stop_ms"]["n"]
    assert arrivals["streamed"]["first_audio_after_stop_ms"]["n"] == 2
    assert all(r["speech_stopped_ms"] == 0.0 for r in requests if r["client"] in whole)
    # every turn that ended by server VAD was streamed (the rounds' 2, the arrivals' 2); one
    # with camera frames is taken whole ("changed": frames are not streamed yet)
    turns = head["streamed_turns"]
    assert sum(turns.values()) == 4 and turns["prefilled"] >= 2, turns
    assert "whole turns" in printed and "streamed turns" in printed
    assert "measured mean" in printed and "p99 left out" in printed
    assert (  # beside the tables: the graph they come from, and what was changed in it
        "every row: pipeline/configs/qwen3_omni_tiny.yaml with --think-tokens 8:"
        " thinker.max_new_tokens=8 (file: 24)" in printed
    )


def test_p99_is_given_from_a_hundred_requests_on() -> None:
    assert distribution([])["n"] == 0
    few = distribution([float(v) for v in range(99)])
    assert few["p99"] is None and few["p99_left_out"] == "n = 99 < 100"
    assert few["max"] == 98 and few["p50"] == 49
    enough = distribution([float(v) for v in range(101)])
    assert enough["p99"] == 99.0 and "p99_left_out" not in enough


def test_a_session_refused_past_the_cap_is_counted_with_its_reason_not_as_an_error() -> None:
    """Offered more sessions than the graph holds, the server refuses the rest at their start
    (`session_limit`, as an H100's cap of 6 did to 10): each is counted apart with its reason,
    and the level goes on with the sessions admitted."""
    served = Request(2, 0, 0, False, 1.0, speech_stopped_ms=5.0, first_audio_ms=300.0)
    served.audio_s = 1.0
    refused = failed_session(
        Request(2, 1, 0, False, 0.0),
        Refused("session_limit", "all 6 session slots are in use; try again shortly"),
    )
    broken = failed_session(Request(2, 2, 0, False, 0.0), ConnectionResetError("gone"))
    figures = request_figures([served, refused, broken])
    assert figures["requests"] == 3 and figures["with_audio"] == 1
    assert figures["refused"] == 1 and figures["error_count"] == 1
    assert figures["refusals"] == [
        "server error session_limit: all 6 session slots are in use; try again shortly"
    ]
    assert figures["errors"] == ["ConnectionResetError('gone')"]
    assert "(1 refused: server error session_limit" in row("3 sessions", figures)
