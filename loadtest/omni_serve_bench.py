"""Benchmark: `parley serve` with concurrent OpenAI Realtime WebSocket clients on the same
machine, each asking spoken questions; first audio as the client hears it, next to the
graph's own first audio, so the session layer's share is known.

The server is started here (`python -m web.cli serve`, so it runs from a checkout where
Parley is not pip-installed) on a free loopback port with its embedded redis-server (found
on PATH), and is ready when `/readyz` says 200: that wait is the start-up time. For each
`--concurrency` level, that many sessions first ask one warm-up question each, then
`--reps` rounds of questions (more rounds at small levels with `--min-requests`), each
session a client of its own (loadtest/omni_serve_client.py: speech streamed in real time,
then the microphone's silence, turns ended by the server's VAD, or `--turn manual`: commit
and response.create). Per level: first audio p50 / p95 from the end of the speech sent and
from the server's `speech_stopped`, audio seconds, playback stalls, errors; and from the
server's `/metrics`, read before and after the measured rounds, the mean time from a
request reaching the graph to each stage's first chunk (`parley_stage_first_chunk_seconds`,
answers only): the graph's first audio with no session, transport or VAD in it.

The questions are spoken by espeak-ng at run time, or read from `--speech` (an .npz that
loadtest/gpu_bundle.py writes with the same voice, for machines without espeak-ng).
Random-weight graphs never stop by themselves: `--think-tokens` and `--speech-s` fix the
answer's length (minimum and maximum) in a copy of the graph file, as omni_bench does;
`--device` moves every stage. `--time-limit-s` bounds the run: no round is started that
would end past it (judged by that session's last), and the JSON is written after each level.

Here (the plumbing, the test's configuration):

    python -m loadtest.omni_serve_bench --pipeline qwen3_omni_tiny --concurrency 1,2

On an offline GPU host, from the repo root with the bundle carried (`.gpu/`, built by
`python -m loadtest.gpu_bundle` on a machine with PyPI), as one command (`$OUT` is where
the report goes):

    pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl &&
    export PYTHONPATH=/tmp/site:$PWD PATH=$PWD/.gpu/redis/bin:$PATH &&
    python -m loadtest.omni_serve_bench --pipeline qwen3_omni --think-tokens 64
      --speech-s 5 --speech .gpu/speech.npz --concurrency 1,4,10,32 --reps 1
      --min-requests 20 --time-limit-s 500 --out $OUT/omni_serve_h200.json

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
import yaml

from .omni_serve_client import RATE, Request, chunks, run_client
from .questions import QUESTIONS
from .run_stamp import command_output, source_stamp
from .served import free_port

START_S = 900.0
"""The longest a server may take to be ready: Qwen3-Omni's three stages load ~66 GiB."""
STOP_S = 60.0
QUESTION_COUNT = 4
SPEECH_KEY = "q{}"


# --- the graph and the server --------------------------------------------------------------


def graph_file(args: argparse.Namespace, folder: Path) -> str:
    """The graph to serve: `--pipeline` as it is, or a copy with the lengths and device set."""
    if args.think_tokens is None and args.speech_s is None and args.device is None:
        return str(args.pipeline)
    from pipeline.registry import graph_path

    graph = yaml.safe_load(graph_path(args.pipeline).read_text())
    for stage in graph["stages"]:
        engine_args = stage.setdefault("engine_args", {})
        if args.think_tokens is not None and stage["engine"].endswith(".thinker"):
            engine_args["max_new_tokens"] = engine_args["min_new_tokens"] = args.think_tokens
        if args.speech_s is not None and stage["engine"].endswith(".talker"):
            frames = round(args.speech_s * 12.5)  # Qwen3-Omni's codec: 12.5 frames a second
            engine_args["max_frames"] = engine_args["min_frames"] = frames
        if args.device is not None and "device" in engine_args:
            engine_args["device"] = args.device
            placement = stage.get("placement", {})
            if "devices" in placement:
                placement["devices"] = [args.device]
    path = folder / f"{graph['name']}_bench.yaml"
    path.write_text(yaml.safe_dump(graph, sort_keys=False))
    return str(path)


def start_server(
    args: argparse.Namespace, graph: str, log_path: Path
) -> tuple[subprocess.Popen[bytes], int, float]:
    """`python -m web.cli serve` on a free port: (the process, the port, seconds to ready)."""
    port = free_port()
    sessions = 2 * max(args.concurrency) + 8  # the last level's sessions may still be closing
    cmd = [sys.executable, "-m", "web.cli", "serve", "--port", str(port), "--pipeline", graph]
    cmd += ["--max-sessions", str(sessions), "--log-level", args.log_level]
    if args.model_path:
        cmd += ["--model-path", args.model_path]
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


def first_chunk_sums(port: int) -> dict[str, tuple[float, float]]:
    """Per stage: (sum, count) of `parley_stage_first_chunk_seconds` for answers."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found: dict[str, list[float]] = {}
    pattern = r"^parley_stage_first_chunk_seconds_(sum|count)\{([^}]*)\} ([0-9.e+-]+)$"
    for part, labels, value in re.findall(pattern, text, re.M):
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if named.get("kind") != "answer":
            continue
        pair = found.setdefault(named["stage"], [0.0, 0.0])
        pair[0 if part == "sum" else 1] += float(value)
    return {stage: (pair[0], pair[1]) for stage, pair in found.items()}


# --- speech --------------------------------------------------------------------------------


def load_speech(path: str | None) -> list[np.ndarray[Any, np.dtype[np.int16]]]:
    """The questions as 24 kHz PCM16: from an .npz of `gpu_bundle.write_speech`, or spoken
    by espeak-ng now."""
    if path:
        with np.load(path) as saved:
            return [saved[SPEECH_KEY.format(i)].astype(np.int16) for i in range(len(saved))]
    from .speech import speak, trim_silence

    return [trim_silence(speak(q.text, RATE)) for q in QUESTIONS[:QUESTION_COUNT]]


# --- figures -------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def level_figures(
    requests: list[Request], graph_ms: dict[str, float | None], wall_s: float
) -> dict[str, Any]:
    measured = [r for r in requests if not r.warmup]
    heard = [r for r in measured if r.first_audio_ms is not None and r.error is None]
    first = [r.first_audio_ms for r in heard if r.first_audio_ms is not None]
    after_stop = [x for r in heard if (x := r.first_audio_after_stop_ms) is not None]
    stopped = [r.speech_stopped_ms for r in heard if r.speech_stopped_ms is not None]
    text = [r.first_text_ms for r in heard if r.first_text_ms is not None]
    stalls = [r.stall_max_ms for r in heard]
    audio_graph = graph_ms.get("code2wav") or next(reversed(graph_ms.values()), None)
    share = None
    if audio_graph is not None and after_stop:
        share = round(float(np.mean(after_stop)) - audio_graph, 1)
    return {
        "requests": len(measured),
        "with_audio": len(heard),
        "errors": [r.error for r in measured if r.error][:5],
        "error_count": sum(1 for r in measured if r.error or r.first_audio_ms is None),
        "first_audio_ms": {
            "p50": _pct(first, 50),
            "p95": _pct(first, 95),
            "min": _pct(first, 0),
            "max": _pct(first, 100),
        },
        "first_audio_after_stop_ms": {
            "p50": _pct(after_stop, 50),
            "p95": _pct(after_stop, 95),
            "mean": round(float(np.mean(after_stop)), 1) if after_stop else None,
        },
        "speech_stopped_ms_p50": _pct(stopped, 50),
        "first_text_ms_p50": _pct(text, 50),
        "audio_s_mean": round(float(np.mean([r.audio_s for r in heard])), 2) if heard else None,
        "stall_max_ms": {
            "p50": _pct(stalls, 50),
            "p95": _pct(stalls, 95),
            "max": _pct(stalls, 100),
        },
        "graph_first_chunk_ms_mean": graph_ms,
        "session_share_ms": share,
        "wall_s": round(wall_s, 1),
    }


def graph_means(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for stage, (total, count) in after.items():
        total0, count0 = before.get(stage, (0.0, 0.0))
        n = count - count0
        out[stage] = round((total - total0) / n * 1000, 1) if n > 0 else None
    return out


def table(levels: list[dict[str, Any]]) -> str:
    head = (
        f"{'sessions':>8} {'requests':>8} {'audio':>6} {'first audio p50/p95':>20} "
        f"{'after stop p50/p95':>19} {'graph':>7} {'session':>8} {'stall p50/max':>14}"
    )
    lines = [head]
    for row in levels:
        f = row["figures"]
        fa, st, sl = f["first_audio_ms"], f["first_audio_after_stop_ms"], f["stall_max_ms"]
        graph = f["graph_first_chunk_ms_mean"]
        audio_graph = graph.get("code2wav") or next(reversed(graph.values()), None)
        lines.append(
            f"{row['sessions']:>8} {f['requests']:>8} {f['with_audio']:>6} "
            f"{_ms(fa['p50'])} / {_ms(fa['p95'])} {_ms(st['p50'])} / {_ms(st['p95'])} "
            f"{_ms(audio_graph)} {_ms(f['session_share_ms'])} "
            f"{_ms(sl['p50'])} / {_ms(sl['max'])}"
        )
    lines.append(
        "ms; first audio from the end of the speech sent; after stop: from the server's "
        "speech_stopped; graph: request in -> first audio chunk inside the server (mean); "
        "session: after-stop mean minus graph"
    )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{value:>8.0f}" if value is not None else f"{'-':>8}"


# --- the run -------------------------------------------------------------------------------


def header(args: argparse.Namespace, graph: str, start_s: float) -> dict[str, Any]:
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
        "graph": Path(graph).read_text() if Path(graph).is_file() else graph,
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
    manual = args.turn == "manual"
    started = time.monotonic()
    warm = [(k, True) for k in range(args.warmup)]
    if warm:
        await asyncio.gather(
            *(run_client(url, manual, speech, warm, n, i, speech_s, deadline) for i in range(n))
        )
    rounds = max(args.reps, math.ceil(args.min_requests / n))
    plan = [(args.warmup + k, False) for k in range(rounds)]
    before = await asyncio.to_thread(first_chunk_sums, port)
    measured = await asyncio.gather(
        *(run_client(url, manual, speech, plan, n, i, speech_s, deadline) for i in range(n)),
        return_exceptions=True,
    )
    after = await asyncio.to_thread(first_chunk_sums, port)
    requests: list[Request] = []
    for i, client in enumerate(measured):
        if isinstance(client, BaseException):  # the session itself failed: one error for it
            failed = Request(n, i, args.warmup, False, 0.0, error=repr(client))
            requests.append(failed)
        else:
            requests.extend(client)
    figures = level_figures(requests, graph_means(before, after), time.monotonic() - started)
    return {
        "sessions": n,
        "rounds": rounds,
        "figures": figures,
        "requests": [r.record() for r in requests],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipeline", default="qwen3_omni_tiny", help="a graph name or file")
    parser.add_argument("--model-path", default=None, help="a Qwen3-Omni checkpoint (serve's)")
    parser.add_argument("--device", default=None, help="every stage's device, e.g. cuda:1")
    parser.add_argument("--think-tokens", type=int, default=None, help="fixed reply tokens")
    parser.add_argument("--speech-s", type=float, default=None, help="fixed answer speech (s)")
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 10, 32]
    )
    parser.add_argument("--reps", type=int, default=1, help="measured rounds per level")
    parser.add_argument(
        "--min-requests",
        type=int,
        default=0,
        help="more rounds at a level until it has this many requests",
    )
    parser.add_argument("--warmup", type=int, default=1, help="warm-up rounds per level")
    parser.add_argument("--turn", choices=("server_vad", "manual"), default="server_vad")
    parser.add_argument("--speech", default=None, help=".npz of questions (gpu_bundle)")
    parser.add_argument("--time-limit-s", type=float, default=None)
    parser.add_argument("--start-s", type=float, default=START_S)
    parser.add_argument("--log-level", default="warning", help="the server's")
    parser.add_argument("--out", default=None, help="write the report here (JSON)")
    args = parser.parse_args(argv)
    began = time.monotonic()
    deadline = began + args.time_limit_s - STOP_S if args.time_limit_s else None
    pcm = load_speech(args.speech)
    speech = [chunks(p) for p in pcm]
    speech_s = [len(p) / RATE for p in pcm]
    folder = Path(tempfile.mkdtemp(prefix="omni-serve-bench-"))
    graph = graph_file(args, folder)
    proc, port, start_s = start_server(args, graph, folder / "server.log")
    report: dict[str, Any] = {"header": header(args, graph, start_s), "levels": []}
    print(f"server ready in {start_s:.1f} s (pid {proc.pid}, port {port})", flush=True)
    try:
        for n in args.concurrency:
            if deadline is not None and time.monotonic() > deadline:
                report["header"]["stopped_at_time_limit"] = True
                break
            level = asyncio.run(
                run_level(f"ws://127.0.0.1:{port}", port, n, args, speech, speech_s, deadline)
            )
            report["levels"].append(level)
            print(f"{n} sessions: {json.dumps(level['figures'])}", flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    finally:
        stop_server(proc)
        report["header"]["server_log_tail"] = _tail(folder / "server.log")
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(table(report["levels"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
