"""Benchmark: what speech and noise over an answer do to it, with `interruption` "always"
(today's behaviour, OpenAI's meaning) beside "adaptive", in one run on one server.

    python -m loadtest.interruption_bench [--pipeline cascade|echo] [--cases N] [--reps R]
        [--time-limit S] [--concurrency C] [--voices piper espeak-us ...] [--url ws://...]
        [--json loadtest/results/NAME.json]

Each case of `loadtest.interruption_set` (a backchannel, a noise burst, a cough, a second
voice or a real interruption, spoken by Piper's voice or an espeak-ng voice, at an onset
into the answer, in background noise at 10-20 dB SNR) runs in a fresh session over the
OpenAI Realtime WebSocket, once per mode: the question, spoken by Piper at a microphone's
pace; its answer, played by the client at real time; the sound mixed into the microphone at
the onset after the answer's first audio arrived (`loadtest.interruption_call`). Without
`--url` a `parley serve --pipeline PIPELINE` is started in a child process.

Before the cases, the question is asked once with nothing over its answer: the answer's
length bounds the onsets (a sound starts at least 1.5 s before the answer would end) and
warms the server. The figures (`loadtest.interruption_figures`): precision and recall of
"interrupt", the share of other answers wrongly cut, the audio they lost, and for real
interruptions the time from the first voiced sample to the old answer's last played sample.

On `echo` the pipeline has no recogniser: adaptive judges by the voice's length alone (what
stops before 700 ms is kept, whatever its words). The cascade hears the words (Whisper).

Bounded: `--cases` sounds (taken so that every kind comes early), `--reps` times each, and
no case starts after `--time-limit` seconds; each case gives up after 90 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from .interruption_call import Outcome, run_case
from .interruption_figures import mode_figures, table
from .interruption_set import (
    KINDS,
    RATE,
    SPEECH_DBFS,
    VOICES,
    Case,
    Pcm,
    Sound,
    cases,
    levelled,
    sounds,
    speakers,
)
from .run_stamp import source_stamp
from .served import parley_serve

MODES = ("always", "adaptive")
QUESTIONS = {
    "cascade": "Tell me a long story about a dragon who bakes bread.",
    "echo": (
        "Could you please tell me what the weather will be like in Boston tomorrow, "
        "and whether I should take an umbrella when I go out for a walk in the morning?"
    ),
}
"""The question per pipeline: its answer must outlast the onsets. The echo's answer is the
question itself, so its question is long."""
SERVER_START_S = 180.0


def question_audio(pipeline: str, voice: str) -> Pcm:
    text = QUESTIONS.get(pipeline, QUESTIONS["cascade"])
    return levelled(speakers((voice,))[voice](text), SPEECH_DBFS)


async def verdict_counts(http_url: str) -> dict[str, float]:
    """The server's `parley_overlap_verdicts` by verdict (empty if /metrics cannot say)."""
    try:
        async with httpx.AsyncClient(base_url=http_url, timeout=10) as http:
            text = (await http.get("/metrics")).text
    except httpx.HTTPError:
        return {}
    found: dict[str, float] = {}
    for verdict in ("keep", "interrupt", "deadline"):
        pattern = rf'^parley_overlap_verdicts_total{{[^}}]*verdict="{verdict}"[^}}]*}} (\S+)$'
        found[verdict] = sum(float(v) for v in re.findall(pattern, text, re.M))
    return found


async def run(
    url: str,
    chosen: list[Case],
    question: Pcm,
    *,
    modes: tuple[str, ...] = MODES,
    concurrency: int = 1,
    time_limit_s: float = 420.0,
    max_output_tokens: int | None = None,
) -> dict[str, Any]:
    """The reference answer, then every case in every mode (both modes of a case started
    together, no case after `time_limit_s`): the figures and every outcome."""
    started = time.monotonic()
    reference_case = Case(-1, Sound("none", "-", "-", np.zeros(0, np.int16), False), 0, 20.0)
    reference = await run_case(url, reference_case, modes[0], question, None, max_output_tokens)
    if reference.cut is not False:
        raise RuntimeError(f"the reference answer failed: {reference.failure or 'cut'}")
    answer_ms = reference.heard_ms
    http_url = url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    verdicts_before = await verdict_counts(http_url)
    outcomes: list[Outcome] = []
    jobs = iter([(case, mode) for case in chosen for mode in modes])
    begun: set[int] = set()
    skipped: set[int] = set()

    async def worker() -> None:
        """Takes the next (case, mode) in turn (a case's modes one after the other), and
        begins no case past the time limit."""
        for case, mode in jobs:  # one iterator shared by the workers
            if case.index not in begun:
                if time.monotonic() - started > time_limit_s:
                    skipped.add(case.index)
                    continue
                begun.add(case.index)
            outcomes.append(await run_case(url, case, mode, question, answer_ms, max_output_tokens))

    async with asyncio.TaskGroup() as group:
        for n in range(max(1, concurrency)):
            group.create_task(worker(), name=f"interruption-bench-{n}")
    verdicts_after = await verdict_counts(http_url)
    whole = [o.heard_ms for o in outcomes if o.cut is False] + [reference.heard_ms]
    whole_ms = statistics.median(whole)
    outcomes.sort(key=lambda o: (o.case.index, modes.index(o.mode)))
    return {
        "answer_ms": {"reference": round(answer_ms), "median_whole": round(whole_ms)},
        "skipped_for_time": len(skipped),
        "figures": {m: mode_figures([o for o in outcomes if o.mode == m], whole_ms) for m in modes},
        "server_overlap_verdicts": {
            k: verdicts_after.get(k, 0.0) - verdicts_before.get(k, 0.0) for k in verdicts_after
        },
        "cases": [o.record() for o in outcomes],
        "wall_s": round(time.monotonic() - started, 1),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipeline", default="cascade", help="for the server started here")
    parser.add_argument("--url", help="ws://HOST:PORT of a running server; else start one")
    parser.add_argument("--cases", type=int, help="sounds taken from the set (default: all)")
    parser.add_argument("--reps", type=int, default=1, help="times each sound is played")
    parser.add_argument("--voices", nargs="+", default=list(VOICES), choices=VOICES)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--question-voice", default="piper", choices=VOICES)
    parser.add_argument("--concurrency", type=int, default=1, help="sessions at once")
    parser.add_argument("--time-limit", type=float, default=420.0, help="no case starts later")
    parser.add_argument("--max-output-tokens", type=int, help="caps each answer's length")
    parser.add_argument("--json", type=Path, help="also write the report here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    header = {
        **source_stamp(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cores": os.cpu_count(), "load_average_before": os.getloadavg()},
        "argv": vars(args) | {"json": str(args.json) if args.json else None},
        "question": QUESTIONS.get(args.pipeline, QUESTIONS["cascade"]),
    }
    chosen = cases(sounds(tuple(args.voices), tuple(args.kinds)), args.cases, args.reps)
    question = question_audio(args.pipeline, args.question_voice)
    print(
        f"{len(chosen)} cases x {len(MODES)} modes on {args.url or args.pipeline}; "
        f"question {len(question) / RATE:.1f} s; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            served = parley_serve("--pipeline", args.pipeline, start_s=SERVER_START_S)
            url = stack.enter_context(served).ws_url
        report = asyncio.run(
            run(
                url,
                chosen,
                question,
                concurrency=args.concurrency,
                time_limit_s=args.time_limit,
                max_output_tokens=args.max_output_tokens,
            )
        )
    header["machine"]["load_average_after"] = os.getloadavg()
    print(table(report["figures"]))
    print(
        f"answer {report['answer_ms']['median_whole']} ms whole; server verdicts "
        f"{report['server_overlap_verdicts']}; {report['skipped_for_time']} cases skipped "
        f"for time; {report['wall_s']} s"
    )
    if args.json:
        args.json.write_text(json.dumps({"header": header, **report}, indent=2) + "\n")
        print(f"report: {args.json}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
