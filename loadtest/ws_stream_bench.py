"""What one streamed chunk of OpenAI-WebSocket audio costs the server, and how late it is
handled, at N sessions streaming 24 kHz PCM16 in real time.

    python -m loadtest.ws_stream_bench --steps 50,100,200 [--workers 2] [--gen-procs 2]

Each step starts N sessions on one `parley serve --pipeline echo` (loadtest/served.py) and
streams `input_audio_buffer.append` messages, one per 20 ms, from `--gen-procs` generator
processes. The messages are built once (one JSON text per chunk content: silence with low
noise, and a few espeak-ng questions), so the generator only sends them. Each session
speaks a question every `--cycle-s` seconds (phase shifted per session), so the VAD and
turns run, and the echo pipeline answers.

Figures per step, over the measured window (after the ramp and a warm-up):
- server CPU per chunk: utime+stime of the `parley serve` process and all its descendants
  (workers, the embedded redis-server, listed apart) from /proc, over the chunks sent;
- generator CPU (per chunk too), so a busy generator is never mistaken for a slow server;
- chunk lag: how late the server handles the chunk that ends a turn. The server can say
  `input_audio_buffer.speech_stopped` (its `audio_end_ms` + the 500 ms silence window) no
  earlier than it has handled the chunk holding that point of the input; the lag is the
  arrival of the event minus the moment that chunk was sent. An idle server shows the
  VAD's frame granularity here (a few ms); queueing anywhere on the way shows as more;
- send lag: how far behind its real-time schedule the generator sent (its own lateness).

The generator's clients are bare (`ws_raw_client.py`): it reads one event out of every
answer's ~40 messages, and a full client's parsing of the rest cost it more than the
sending.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.tasks import TaskSet
from web import event_loop

from .proc_cpu import cpu_seconds, is_redis, tree
from .served import parley_serve
from .speech import speak, trim_silence
from .ws_raw_client import TEXT, masked_frame, open_raw

RATE = 24_000
CHUNK_MS = 20
CHUNK_SAMPLES = RATE * CHUNK_MS // 1000
SILENCE_MS = 500
"""The server's default `silence_duration_ms` (server_vad)."""
QUESTIONS = (
    "What is the capital of France?",
    "How far away is the moon?",
    "Tell me a short joke about cats.",
)


def _append(pcm: np.ndarray[Any, np.dtype[np.int16]]) -> str:
    audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode("ascii")
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


def build_messages(cycle_s: float) -> tuple[list[str], list[int]]:
    """One cycle of append texts (silence, a question, silence) and, per question, the
    chunk index where its speech ends. Chunks are shared between sessions."""
    rng = np.random.default_rng(3)
    speech = trim_silence(speak(QUESTIONS[0], RATE))
    total = int(cycle_s * 1000) // CHUNK_MS
    lead = total // 3
    noise = [
        np.clip(rng.integers(-30, 31, CHUNK_SAMPLES), -32768, 32767).astype(np.int16)
        for _ in range(8)
    ]
    silence = [_append(n) for n in noise]
    messages = [silence[i % len(silence)] for i in range(total)]
    spoken = -(-len(speech) // CHUNK_SAMPLES)
    padded = np.zeros(spoken * CHUNK_SAMPLES, np.int16)
    padded[: len(speech)] = speech
    for i in range(spoken):
        part = padded[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES].astype(np.int32) + noise[i % 8]
        messages[lead + i] = _append(np.clip(part, -32768, 32767).astype(np.int16))
    return messages, [lead + spoken]


MASK = b"\x5a\x17\xc3\x8e"
SLOTS = 10
"""Sessions send in this many phases of the 20 ms period (2 ms apart), as unsynchronised
clients would, rather than all at once."""


def client_frame(text: str) -> bytes:
    """`text` as one masked WebSocket text frame, built once and sent as is. The mask key
    is fixed (a real client draws one per frame; the server unmasks either the same)."""
    return masked_frame(TEXT, text.encode(), MASK)


@dataclass(frozen=True)
class Plan:
    url: str
    sessions: int
    ramp_s: float
    start_at: float
    """time.time() at which measuring starts."""
    end_at: float
    cycle_s: float


@dataclass
class Stream:
    """One session's stream: its socket and when each of its chunks went out."""

    transport: Any
    phase: int
    slot: int
    first_tick: int
    sent_at: dict[int, float]


class Generator:
    """All the sessions of one generator process, fed by one ticker (a timer per session
    would cost the generator more than the sends)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        texts, _ = build_messages(plan.cycle_s)
        self.frames = [client_frame(t) for t in texts]
        self.slots: list[list[Stream]] = [[] for _ in range(SLOTS)]
        self.tick = 0
        self.lag: list[float] = []
        self.send_lag: list[float] = []
        self.chunks = 0
        self.t0 = time.monotonic()
        self.wall0 = time.time()

    def measuring(self, at: float) -> bool:
        return self.plan.start_at <= self.wall0 + (at - self.t0) <= self.plan.end_at

    async def ticker(self) -> None:
        """Every 2 ms, the next chunk of the sessions in that slot."""
        n = len(self.frames)
        step = CHUNK_MS / 1000 / SLOTS
        while self.wall0 + (time.monotonic() - self.t0) < self.plan.end_at + 1.0:
            due = self.t0 + self.tick * step
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            slot, period = self.tick % SLOTS, self.tick // SLOTS
            now = time.monotonic()
            count = self.measuring(now)
            for s in self.slots[slot]:
                if s.transport.is_closing():
                    continue
                k = period - s.first_tick
                s.transport.write(self.frames[(k + s.phase) % n])
                s.sent_at[k] = now
                s.sent_at.pop(k - 500, None)
                if count:
                    self.chunks += 1
            if count:
                self.send_lag.append((now - due) * 1000)
            self.tick += 1

    async def session(self, index: int) -> None:
        stream: Stream | None = None

        def on_text(raw: bytes) -> None:
            if stream is None or b'"input_audio_buffer.speech_stopped"' not in raw[:120]:
                return
            at = time.monotonic()
            point = int(json.loads(raw)["audio_end_ms"]) + SILENCE_MS
            k = point // CHUNK_MS
            if k in stream.sent_at and self.measuring(at):
                self.lag.append((at - stream.sent_at[k]) * 1000)

        client = await open_raw(self.plan.url, on_text)
        try:
            assert client.transport is not None
            stream = Stream(
                client.transport,
                random.randrange(len(self.frames)),
                index % SLOTS,
                self.tick // SLOTS + 1,
                {},
            )
            self.slots[stream.slot].append(stream)
            await client.closed
        finally:
            client.close()


async def _generate(plan: Plan) -> dict[str, Any]:
    gen = Generator(plan)
    async with TaskSet("ws-stream-bench") as owned:  # the ticker and the sessions
        ticker = owned.create_task(gen.ticker())
        tasks = []
        for i in range(plan.sessions):  # their failures are counted below
            tasks.append(owned.create_task(gen.session(i), log_failure=False))
            await asyncio.sleep(plan.ramp_s / max(plan.sessions, 1))
        cpu: list[float] = []
        await asyncio.sleep(max(0.0, plan.start_at - time.time()))
        cpu.append(_self_cpu())
        await asyncio.sleep(max(0.0, plan.end_at - time.time()))
        cpu.append(_self_cpu())
        await ticker
        failed = [t for t in tasks if t.done() and t.exception() is not None]
    return {
        "lag": gen.lag,
        "send_lag": gen.send_lag,
        "chunks": gen.chunks,
        "cpu_s": cpu[1] - cpu[0],
        "errors": [repr(t.exception()) for t in failed[:3]],
        "failed": len(failed),
    }


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _generator(plan: Plan, queue: Any) -> None:
    queue.put(event_loop.run(_generate(plan)))  # uvloop where installed, like the server


def _tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds of `root` and every descendant: the embedded redis-server apart."""
    totals: dict[str, float] = {}
    for pid in tree(root):
        kind = "redis" if is_redis(pid) else "parley"
        try:
            totals[kind] = totals.get(kind, 0.0) + cpu_seconds(pid)
        except OSError:
            continue  # ended meanwhile
    return totals


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_step(url: str, pid: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    procs = max(1, min(args.gen_procs, n))
    ramp = max(2.0, n / args.connect_rate)
    start_at = time.time() + ramp + args.warmup_s
    end_at = start_at + args.measure_s
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    workers = []
    for i in range(procs):
        share = n // procs + (1 if i < n % procs else 0)
        plan = Plan(url, share, ramp, start_at, end_at, args.cycle_s)
        proc = ctx.Process(target=_generator, args=(plan, queue))
        proc.start()
        workers.append(proc)
    time.sleep(max(0.0, start_at - time.time()))
    before, load = _tree_cpu(pid), os.getloadavg()
    time.sleep(max(0.0, end_at - time.time()))
    after, load2 = _tree_cpu(pid), os.getloadavg()
    parts = [queue.get(timeout=120) for _ in workers]
    for proc in workers:
        proc.join(30)
    chunks = sum(p["chunks"] for p in parts)
    lag = [x for p in parts for x in p["lag"]]
    send_lag = [x for p in parts for x in p["send_lag"]]
    server = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    gen_cpu = sum(p["cpu_s"] for p in parts)
    per = 1e6 / max(chunks, 1)
    return {
        "sessions": n,
        "chunks": chunks,
        "failed_sessions": sum(p["failed"] for p in parts),
        "errors": [e for p in parts for e in p["errors"]][:3],
        "server_us_per_chunk": round(sum(server.values()) * per, 1),
        "parley_us_per_chunk": round(server.get("parley", 0.0) * per, 1),
        "redis_us_per_chunk": round(server.get("redis", 0.0) * per, 1),
        "server_cores": round(sum(server.values()) / args.measure_s, 2),
        "generator_us_per_chunk": round(gen_cpu * per, 1),
        "generator_cores": round(gen_cpu / args.measure_s, 2),
        "turns": len(lag),
        "lag_ms_p50": round(_pct(lag, 50), 1),
        "lag_ms_p95": round(_pct(lag, 95), 1),
        "lag_ms_max": round(max(lag, default=float("nan")), 1),
        "send_lag_ms_p95": round(_pct(send_lag, 95), 1),
        "load_avg": [round(load[0], 2), round(load2[0], 2)],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="1,50,100")
    parser.add_argument("--workers", default="1")
    parser.add_argument("--gen-procs", type=int, default=1)
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument("--measure-s", type=float, default=15.0)
    parser.add_argument("--cycle-s", type=float, default=5.0)
    parser.add_argument("--connect-rate", type=float, default=50.0, help="sessions a second")
    parser.add_argument("--pause", type=float, default=5.0, help="seconds to wait between steps")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    steps = [int(s) for s in args.steps.split(",")]
    cap = str(2 * max(steps))  # the previous step's sessions may still be closing
    options = ("--pipeline", "echo", "--workers", args.workers, "--max-sessions", cap)
    with parley_serve(*options) as served:
        url = f"{served.ws_url}/v1/realtime?model=x"
        print(f"server pid {served.process.pid}, workers {args.workers}", file=sys.stderr)
        for n in steps:
            row = run_step(url, served.process.pid, n, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
            time.sleep(args.pause)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
