"""Benchmark: `parley serve` with concurrent OpenAI Realtime WebSocket clients on the same
machine, each asking spoken questions; first audio as the client hears it, next to the
graph's own first audio, so the session layer's share is known.

It serves a graph file, `--pipeline` (pipeline/configs/qwen3_omni.yaml by default), as
`parley serve` serves it: every engine setting the file's. What the command changes is an
override (bench_graph.py), served from a copy of the file and printed in the report's header
and under each table: `--think-tokens` and `--speech-s` (random-weight graphs never stop by
themselves: the answer's length, minimum and maximum; with both and `--arrivals`, the
Talker's `frames_per_token` too, so that a capped answer is spoken in proportion), `--set
STAGE.KEY=VALUE`, `--device`, `--model-path`.

The server is started here (`python -m web.cli serve`, so it runs from a checkout where
Parley is not pip-installed) on a free loopback port with its embedded redis-server (found
on PATH), and is ready when `/readyz` says 200: that wait is the start-up time. Two loads:

- synchronised rounds (`--concurrency`): for each level, that many sessions first ask one
  warm-up question each, then `--reps` rounds of questions (more rounds at small levels
  with `--min-requests`), each session a client of its own (loadtest/omni_serve_client.py:
  speech streamed in real time, then the microphone's silence, turns ended by the server's
  VAD, or `--turn manual`: commit and response.create), every session asking at once;
- Poisson arrivals (`--arrivals`, target mean sessions, e.g. 8,16,32; omni_arrivals.py):
  sessions that come on their own at the rate that gives that many on average (the rate
  and the measured mean are both reported), each asking one question of 2-10 s with an
  answer of varied length, audio only or audio with camera frames (reported apart); with
  `--whole-turns SHARE`, that share of them commits its turn by hand (turn detection off),
  so the server takes it whole, while the others' turns (server VAD) are streamed to the
  Thinker as they speak: both paths in one run, reported apart (`streamed`, `whole_turn`;
  a whole turn's first audio is counted from its commit, a streamed one's from
  `speech_stopped`).

Per level (and per set of the Poisson levels): n, p50, p95, p99 and max of first audio
after the server's `speech_stopped`, of the answer's RTF as heard, and of playback stalls
(serve_figures.py: p99 only where n >= 100, else the report says why); first audio from the
end of the speech sent too; and, for rounds, from the server's `/metrics` read before and
after them, the mean time from a request reaching the graph to each stage's first chunk
(`parley_stage_first_chunk_seconds`, answers only): the graph's own first audio, with no
session, transport or VAD in it.

The questions are spoken by espeak-ng at run time, or read from `--speech` (an .npz that
loadtest/gpu_bundle.py writes with the same voice, for machines without espeak-ng).
`--time-limit-s` bounds the run, the server's start included (a minute or more for the
shipped graph), less `STOP_S` kept to stop it: no round is started that would end past it
(judged by that session's last), no arrival starts past it, and the JSON is written after
each level. A level the limit cut short says so (`cut_at_time_limit`). Sessions the server
refuses at their start (past its session cap: `session_limit`) are counted apart with their
reason (`refused`, `refusals`), not as errors.

Here (the plumbing, the test's configuration):

    python -m loadtest.omni_serve_bench --pipeline qwen3_omni_tiny --concurrency 1,2 \
        --arrivals 3 --arrival-requests 6

On an offline GPU host, from the repo root with the bundle carried (`.gpu/`, built by
`python -m loadtest.gpu_bundle` on a machine with PyPI), as one command (`$OUT` is where
the report goes):

    pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl &&
    export PYTHONPATH=/tmp/site:$PWD PATH=$PWD/.gpu/redis/bin:$PATH &&
    python -m loadtest.omni_serve_bench --think-tokens 64 --speech-s 5
      --speech .gpu/speech.npz --concurrency "" --arrivals 8,16,32 --arrival-requests 100
      --time-limit-s 540 --out $OUT/omni_serve_arrivals_h200.json

(`.gpu/redis/bin/redis-server` is a wrapper that gives the carried redis-server its own
libraries; nothing else sees them.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from . import turn_phases
from .bench_graph import FRAME_RATE_HZ, BenchGraph, add_graph_options, graph_from_args
from .bench_graph import header_lines as graph_lines
from .omni_arrivals import (
    ArrivalSettings,
    camera_frames,
    level_summary,
    plan,
    run_arrivals,
)
from .omni_serve_client import RATE, Request, chunks, failed_session, run_client
from .published_figures import VLLM_OMNI_3X_H100
from .questions import QUESTIONS
from .run_stamp import command_output, source_stamp
from .serve_figures import graph_means, p99_note, request_figures, row, row_head, session_share
from .served import free_port

START_S = 900.0
"""The longest a server may take to be ready: Qwen3-Omni's three stages load ~66 GiB."""
STOP_S = 60.0
QUESTION_COUNT = 4
SPEECH_KEY = "q{}"
TURN_END_S = 0.6
"""Server VAD's 500 ms of silence and a frame or two: from the speech's end to the turn's."""
FIRST_AUDIO_GUESS_S = 1.0
"""What the expected session time assumes for first audio (the level measures it)."""
ANSWER_GUESS_S = 5.0
"""What it assumes an answer lasts where the graph does not fix its length."""


# --- the graph and the server --------------------------------------------------------------


def bench_graph(args: argparse.Namespace) -> BenchGraph:
    """`--pipeline` with the command's overrides; for arrivals with both answer lengths,
    the Talker speaks a capped answer in proportion (a random-weight Talker never ends by
    itself, so without it every answer would be as long as the longest)."""
    graph = graph_from_args(args)
    talker = graph.stage_by_engine(".talker")
    lengths = args.think_tokens is not None and args.speech_s is not None
    if args.arrivals and lengths and talker is not None:
        frames = round(args.speech_s * FRAME_RATE_HZ)
        per_token = round(frames / max(args.think_tokens - 1, 1), 4)
        asked = f"--think-tokens {args.think_tokens} --speech-s {args.speech_s:g}"
        graph.set_arg(talker, "frames_per_token", per_token, asked)
    graph.check()
    return graph


def start_server(
    args: argparse.Namespace, graph: str, log_path: Path
) -> tuple[subprocess.Popen[bytes], int, float]:
    """`python -m web.cli serve` on a free port: (the process, the port, seconds to ready)."""
    port = free_port()
    levels = [*args.concurrency, *args.arrivals] or [1]
    sessions = 2 * max(levels) + 8  # Poisson peaks, and the last level's still closing
    cmd = [sys.executable, "-m", "web.cli", "serve", "--port", str(port), "--pipeline", graph]
    cmd += ["--max-sessions", str(sessions), "--log-level", args.log_level]
    log = log_path.open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    log.close()  # the child holds its own copy
    deadline = started + args.start_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{_tail(log_path)}")
        if _ready(port):
            return proc, port, time.monotonic() - started
        time.sleep(0.25)
    stop_server(proc)
    raise RuntimeError(f"the server was not ready in {args.start_s:g} s:\n{_tail(log_path)}")


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return int(reply.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()  # SIGTERM: sessions closed, stages and the embedded Redis stopped
    try:
        proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def metric_samples(port: int, pattern: str) -> list[tuple[str, dict[str, str], float]]:
    """The server's `/metrics` samples matching `pattern` (a regex whose groups are the
    name's suffix, then the labels): (suffix, labels, value) each."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return [
        (suffix, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value))
        for suffix, labels, value in re.findall(pattern + r"\{([^}]*)\} (\S+)$", text, re.M)
    ]


def streamed_turn_counts(port: int) -> dict[str, float]:
    """How the server's streamed turns ended so far, by outcome (`parley_stage_streamed_turns`:
    `prefilled` is a turn whose answer went on from what was staged while the user spoke)."""
    found: dict[str, float] = {}
    for _, labels, value in metric_samples(port, r"^parley_stage_streamed_turns(_total)"):
        outcome = labels.get("outcome", "")
        found[outcome] = found.get(outcome, 0.0) + value
    return found


def first_chunk_sums(port: int) -> dict[str, tuple[float, float]]:
    """Per stage: (sum, count) of `parley_stage_first_chunk_seconds` for answers."""
    found: dict[str, list[float]] = {}
    pattern = r"^parley_stage_first_chunk_seconds_(sum|count)"
    for part, named, value in metric_samples(port, pattern):
        if named.get("kind") != "answer":
            continue
        pair = found.setdefault(named["stage"], [0.0, 0.0])
        pair[0 if part == "sum" else 1] += value
    return {stage: (pair[0], pair[1]) for stage, pair in found.items()}


def gpu_memory_gib(port: int) -> dict[str, dict[str, float]]:
    """Per process (a stage's, or `main`): its GPU memory now and at its peak, GiB
    (`parley_gpu_memory_bytes`, `pipeline/gpu_usage.py`), to hold against sizing's plan."""
    found: dict[str, dict[str, float]] = {}
    for _, labels, value in metric_samples(port, r"^parley_gpu_memory_bytes()"):
        found.setdefault(labels["process"], {})[labels["measure"]] = round(value / 2**30, 3)
    return found


# --- speech --------------------------------------------------------------------------------


def load_speech(path: str | None) -> list[np.ndarray[Any, np.dtype[np.int16]]]:
    """The questions as 24 kHz PCM16: from an .npz of `gpu_bundle.write_speech`, or spoken
    by espeak-ng now."""
    if path:
        with np.load(path) as saved:
            return [saved[SPEECH_KEY.format(i)].astype(np.int16) for i in range(len(saved))]
    from .speech import speak, trim_silence

    return [trim_silence(speak(q.text, RATE)) for q in QUESTIONS[:QUESTION_COUNT]]


# --- the run -------------------------------------------------------------------------------


def header(args: argparse.Namespace, graph: BenchGraph, start_s: float) -> dict[str, Any]:
    info: dict[str, Any] = {
        **source_stamp(),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "args": vars(args),
        "argv": sys.argv,
        "graph": graph.report(),
        "server_start_s": round(start_s, 1),
    }
    for module in ("torch", "transformers"):
        try:
            info["machine"][module] = __import__(module).__version__
        except ImportError:
            info["machine"][module] = None
    gpu = command_output(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    )
    info["machine"]["gpu"] = gpu if not gpu.startswith(("FileNotFound", "[Errno")) else None
    return info


async def run_level(
    url: str,
    port: int,
    n: int,
    args: argparse.Namespace,
    speech: list[list[str]],
    speech_s: list[float],
    deadline: float | None,
) -> dict[str, Any]:
    """One level of synchronised rounds: `n` sessions, each asking at once."""
    manual = args.turn == "manual"
    started = time.monotonic()
    warm = [(k, True) for k in range(args.warmup)]
    if warm:
        await asyncio.gather(  # a session refused here is refused again, and counted, below
            *(run_client(url, manual, speech, warm, n, i, speech_s, deadline) for i in range(n)),
            return_exceptions=True,
        )
    rounds = max(args.reps, math.ceil(args.min_requests / n))
    asked = [(args.warmup + k, False) for k in range(rounds)]
    before = await asyncio.to_thread(first_chunk_sums, port)
    measured = await asyncio.gather(
        *(run_client(url, manual, speech, asked, n, i, speech_s, deadline) for i in range(n)),
        return_exceptions=True,
    )
    after = await asyncio.to_thread(first_chunk_sums, port)
    requests: list[Request] = []
    for i, client in enumerate(measured):
        if isinstance(client, BaseException):  # the session failed or was refused: one record
            requests.append(failed_session(Request(n, i, args.warmup, False, 0.0), client))
        else:
            requests.extend(client)
    figures = request_figures(requests)
    figures["graph_first_chunk_ms_mean"] = graph_ms = graph_means(before, after)
    figures["session_share_ms"] = session_share(figures, graph_ms)
    figures["wall_s"] = round(time.monotonic() - started, 1)
    asked_for = n * rounds
    if deadline is not None and len([r for r in requests if not r.warmup]) < asked_for:
        # the time limit (which counts the server's start) came first: say so beside the row
        figures["cut_at_time_limit"] = f"{len(requests)} of {asked_for} requests asked"
    return {
        "sessions": n,
        "rounds": rounds,
        "figures": figures,
        "requests": [r.record() for r in requests],
    }


def expected_session_s(args: argparse.Namespace, graph: BenchGraph) -> float:
    """How long an arriving session is expected to last, for the rate that gives a level's
    mean sessions: the question, the turn's end, first audio, the answer heard out."""
    if args.session_s is not None:
        return float(args.session_s)
    question = sum(args.question_s) / 2
    answer = ANSWER_GUESS_S
    talker = graph.stage_by_engine(".talker")
    told = graph.engine_args(talker) if talker else {}
    per_token = told.get("frames_per_token")
    if per_token and args.answer_tokens:
        answer = per_token * (sum(args.answer_tokens) / 2 - 1) / FRAME_RATE_HZ
    elif told.get("min_frames") and told.get("min_frames") == told.get("max_frames"):
        answer = told["max_frames"] / FRAME_RATE_HZ
    return float(question + TURN_END_S + FIRST_AUDIO_GUESS_S + answer)


async def run_arrival_level(
    url: str,
    target: int,
    args: argparse.Namespace,
    graph: BenchGraph,
    questions: list[np.ndarray[Any, np.dtype[np.int16]]],
    deadline: float | None,
) -> dict[str, Any]:
    """One Poisson level: sessions arriving at the rate that gives `target` on average."""
    low, high = args.question_s
    answers = (args.answer_tokens[0], args.answer_tokens[1]) if args.answer_tokens else None
    settings = ArrivalSettings(
        requests=args.arrival_requests,
        max_s=args.arrival_s,
        question_s=(low, high),
        answer_tokens=answers,
        with_frames=args.with_frames,
        seed=args.seed,
        whole_turns=args.whole_turns,
    )
    session_s = expected_session_s(args, graph)
    rate = target / session_s
    arrivals = plan(target, rate, settings, len(questions))
    with_frames = {a.index for a in arrivals if a.with_frames}
    whole = {a.index for a in arrivals if a.whole_turn}
    frames = camera_frames(args.seed)
    started = time.monotonic()
    requests, spans = await run_arrivals(url, target, arrivals, questions, frames, deadline)
    return {
        **level_summary(target, rate, session_s, arrivals, spans),
        "figures": request_figures(requests),
        "audio_only": request_figures([r for r in requests if r.client not in with_frames]),
        "audio_with_frames": request_figures([r for r in requests if r.client in with_frames]),
        "streamed": request_figures([r for r in requests if r.client not in whole]),
        "whole_turn": request_figures([r for r in requests if r.client in whole]),
        "wall_s": round(time.monotonic() - started, 1),
        "requests": [r.record() for r in requests],
    }


def tables(report: dict[str, Any]) -> str:
    """The printed summary: the graph, then the rounds, then the arrivals."""
    graph = report["header"]["graph"]
    lines = [*graph_lines(graph), ""]
    rows: list[dict[str, Any]] = []
    if report["levels"]:
        lines += ["Synchronised rounds (every session asks at once):", row_head()]
        for level in report["levels"]:
            rows.append(level["figures"])
            lines.append(row(f"{level['sessions']} sessions", level["figures"]))
        shares = [
            f"{lv['sessions']}: {_num(lv['figures']['graph_first_chunk_ms_mean'].get('code2wav'))}"
            f" / {_num(lv['figures']['session_share_ms'])}"
            for lv in report["levels"]
        ]
        lines.append(
            "  the graph's own first audio (request in -> first chunk, mean ms) / the session"
            " layer's share: " + ", ".join(shares)
        )
    if report["arrivals"]:
        lines += ["", "Poisson arrivals (a session per question of 2-10 s, answers varied):"]
        lines.append(row_head())
        for level in report["arrivals"]:
            lines.append(
                f"target {level['target_sessions']}: {level['rate_per_s']:.3f} arrivals/s"
                f" (a session expected to last {level['expected_session_s']:.1f} s): measured"
                f" mean {_num(level['mean_sessions'])} sessions open, at most"
                f" {level['most_sessions']}; {level['sessions_started']} sessions"
            )
            for label, key in (
                ("  all", "figures"),
                ("  audio only", "audio_only"),
                ("  audio + frames", "audio_with_frames"),
                ("  streamed turns", "streamed"),
                ("  whole turns", "whole_turn"),
            ):
                if key in ("streamed", "whole_turn") and not level.get("whole_turn", {}).get(
                    "requests"
                ):
                    continue  # no whole turns asked for: the split says nothing
                rows.append(level[key])
                lines.append(row(label, level[key]))
    lines.append(f"every row: {graph['note']}")
    if (note := p99_note([r for r in rows if r["requests"]])) is not None:
        lines.append(note)
    lines.append(
        "ms; first audio from the server's speech_stopped; RTF as heard: (answer + its"
        " stalls) / answer (the server paces audio at real time); stall: each answer's"
        " total wait"
    )
    lines.append(f"published, not measured here: {VLLM_OMNI_3X_H100.line()}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def pair(kind: type[float] | type[int], text: str) -> list[Any]:
    values = [kind(x) for x in text.split(",") if x.strip()]
    if len(values) != 2 or values[0] > values[1]:
        raise argparse.ArgumentTypeError("write LOW,HIGH")
    return values


def levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_graph_options(p, "qwen3_omni", lengths=True)
    p.add_argument("--concurrency", type=levels, default=[1, 4, 10, 32], help="rounds' levels")
    p.add_argument("--reps", type=int, default=1, help="measured rounds per level")
    p.add_argument(
        "--min-requests",
        type=int,
        default=0,
        help="more rounds at a level until it has this many requests",
    )
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds per level")
    p.add_argument("--turn", choices=("server_vad", "manual"), default="server_vad")
    p.add_argument(
        "--arrivals", type=levels, default=[], help="Poisson levels: mean sessions, e.g. 8,16,32"
    )
    p.add_argument("--arrival-requests", type=int, default=100, help="arrivals per level")
    p.add_argument("--arrival-s", type=float, default=600.0, help="no arrival after this")
    p.add_argument(
        "--question-s",
        type=lambda t: pair(float, t),
        default=[2.0, 10.0],
        help="LOW,HIGH seconds of a question",
    )
    p.add_argument(
        "--answer-tokens",
        type=lambda t: pair(int, t),
        default=None,
        help="LOW,HIGH: each arrival's max_output_tokens (default with --think-tokens: a"
        " quarter of it to all of it)",
    )
    p.add_argument("--with-frames", type=float, default=0.5, help="share sending frames")
    p.add_argument(
        "--whole-turns",
        type=float,
        default=0.0,
        help="share of arrivals whose turns end by commit, taken whole: the baseline of"
        " turns streamed while the user speaks, in the same run",
    )
    p.add_argument("--session-s", type=float, default=None, help="expected session length")
    p.add_argument("--seed", type=int, default=0, help="the arrivals' plan")
    p.add_argument("--speech", default=None, help=".npz of questions (gpu_bundle)")
    p.add_argument("--time-limit-s", type=float, default=None)
    p.add_argument("--start-s", type=float, default=START_S)
    p.add_argument("--log-level", default="warning", help="the server's")
    p.add_argument("--out", default=None, help="write the report here (JSON)")
    return p


def note_gpu_memory(report: dict[str, Any], port: int) -> None:
    """The stages' GPU memory so far (peaks since start) into the report's header, printed."""
    report["header"]["gpu_memory_gib"] = memory = gpu_memory_gib(port)
    if memory:
        print(f"GPU memory (GiB): {json.dumps(memory)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.answer_tokens is None and args.think_tokens is not None and args.arrivals:
        args.answer_tokens = [max(1, args.think_tokens // 4), args.think_tokens]
    began = time.monotonic()
    deadline = began + args.time_limit_s - STOP_S if args.time_limit_s else None
    pcm = load_speech(args.speech)
    speech = [chunks(p) for p in pcm]
    speech_s = [len(p) / RATE for p in pcm]
    folder = Path(tempfile.mkdtemp(prefix="omni-serve-bench-"))
    graph = bench_graph(args)
    proc, port, start_s = start_server(args, str(graph.write(folder)), folder / "server.log")
    report: dict[str, Any] = {"header": header(args, graph, start_s), "levels": [], "arrivals": []}
    print(f"server ready in {start_s:.1f} s (pid {proc.pid}, port {port})", flush=True)
    url = f"ws://127.0.0.1:{port}"

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")

    def out_of_time() -> bool:
        if deadline is not None and time.monotonic() > deadline:
            report["header"]["stopped_at_time_limit"] = True
            return True
        return False

    try:
        for n in args.concurrency:
            if out_of_time():
                break
            level = asyncio.run(run_level(url, port, n, args, speech, speech_s, deadline))
            report["levels"].append(level)
            print(f"{n} sessions: {json.dumps(level['figures'])}", flush=True)
            note_gpu_memory(report, port)
            save()
        for target in args.arrivals:
            if out_of_time():
                break
            found = asyncio.run(run_arrival_level(url, target, args, graph, pcm, deadline))
            report["arrivals"].append(found)
            print(f"arrivals for {target}: {json.dumps(found['figures'])}", flush=True)
            note_gpu_memory(report, port)
            save()
        report["header"]["streamed_turns"] = streamed_turn_counts(port)
        print(f"streamed turns, by outcome: {report['header']['streamed_turns']}", flush=True)
    finally:
        stop_server(proc)
        report["header"]["server_log_tail"] = _tail(folder / "server.log")
        log_text = (folder / "server.log").read_text(errors="replace")
        report["header"]["turn_phases"] = turn_phases.summary(turn_phases.turns(log_text))
        save()
    print(tables(report))
    for line in turn_phases.p50_lines(report["header"].get("turn_phases", {})):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
