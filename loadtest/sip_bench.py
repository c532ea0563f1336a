"""Benchmark: SIP calls held at once with audio both ways, and barge-in latency over RTP.

A `parley serve --pipeline echo --sip-port` runs in a child process (the echo graph answers
each turn with the caller's own words, so no model is the bottleneck, only the transport,
the sessions and turn detection). Per step of N concurrent calls, sipp places N - P of
them (`-l`/`-r`, its `rtp_stream` looping a spoken question the whole call, so Parley hears
speech and answers with audio), and P are placed by `loadtest.sip_probe`, which speaks the
same way and timestamps every RTP packet Parley sends back: a gap over 30 ms between two
arrivals counts as a late packet. Parley's pacing counters stay in the server, so late
packets are measured where a phone would hear them. Also per step: calls answered, the
server's CPU (its process tree, % of one core), sipp's CPU and this process's event loop
lag (a 10 ms ticker's worst overshoot: the probe's clock is only as good as this loop).

Barge-in: one probe call asks, and once 300 ms of the answer has arrived it speaks over it;
the latency is from the first sample of that speech to the last audible answer packet
received (p50/p95 over `--trials`).

    .venv/bin/python -m loadtest.sip_bench [--calls 1,10,20,30] [--seconds 20] [--probes 2]
        [--ramp 1] [--trials 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from pipeline.tasks import TaskSet

from .run_stamp import source_stamp
from .served import free_port, parley_serve
from .sip_probe import Probe
from .sip_sipp import SippRun
from .speech import silence, speak, trim_silence

QUESTION = "What is the capital of France, and how many people live there?"
INTERRUPTION = "Stop, stop, wait a moment please."
SERVER_START_S = 120.0
HELD_PAUSE_MS = 6000
"""Held calls pause this long after each question: the echo's answer (as long as the
question) plays out whole, so a call carries about as much audio out as in."""


@contextlib.contextmanager
def sip_server(max_sessions: int) -> Iterator[tuple[psutil.Process, int]]:
    """`parley serve --pipeline echo --sip-port` on loopback, ready: (process, SIP port)."""
    sip_port = free_port(socket.SOCK_DGRAM)
    options = ["--pipeline", "echo", "--sip-port", str(sip_port)]
    with parley_serve(*options, "--max-sessions", str(max_sessions), start_s=SERVER_START_S) as s:
        yield psutil.Process(s.process.pid), sip_port


class _CpuMeter:
    """Between `start` and `stop`: the CPU of a process and its children (% of one core),
    and how long its main thread (the event loop) sat runnable waiting for a core (% of
    the wall time, from the kernel's schedstat): on a shared machine that wait, not the
    server's own CPU, is what makes a packet late."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        self._cpu0 = self._t0 = 0.0
        self._loop0 = (0.0, 0.0)

    def _cpu(self) -> float:
        total = 0.0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = p.cpu_times()
                total += times.user + times.system
        return total

    def _loop(self) -> tuple[float, float]:
        """The main thread's (seconds on a core, seconds waiting for one)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/schedstat")
        with contextlib.suppress(OSError, ValueError, IndexError):
            ran, waited = path.read_text().split()[:2]
            return int(ran) / 1e9, int(waited) / 1e9
        return 0.0, 0.0

    def start(self) -> None:
        self._cpu0, self._loop0, self._t0 = self._cpu(), self._loop(), time.monotonic()

    def stop(self) -> tuple[float, float, float]:
        """% of the wall time: CPU of the tree, the loop's CPU, the loop's wait for a core."""
        wall = max(time.monotonic() - self._t0, 1e-9)
        (ran0, waited0), (ran, waited) = self._loop0, self._loop()
        cpu = self._cpu() - self._cpu0
        return 100 * cpu / wall, 100 * (ran - ran0) / wall, 100 * (waited - waited0) / wall


async def _loop_lag(lags: list[float]) -> None:
    while True:
        due = time.monotonic() + 0.01
        await asyncio.sleep(0.01)
        lags.append(time.monotonic() - due)


def _speech(pause_ms: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """The question then `pause_ms` of silence, and the interruption (8 kHz)."""
    question = np.concatenate([trim_silence(speak(QUESTION, rate=8000)), silence(pause_ms, 8000)])
    stop = np.concatenate([trim_silence(speak(INTERRUPTION, rate=8000)), silence(600, 8000)])
    return question, stop


async def _talk(probe: Probe, pcm: np.ndarray) -> None:
    while True:
        await probe.say(pcm)


async def step(
    server: psutil.Process,
    sip_port: int,
    calls: int,
    seconds: float,
    probes: int,
    work: Path,
    ramp: float = 1.0,
) -> dict[str, Any]:
    """`calls` held together for `seconds`: sipp places calls - probes, spread over `ramp`
    seconds (1 s: every call's turns end at about the same moment, the worst case), then
    the probes the rest; what is measured starts once all are placed."""
    question, _ = _speech(HELD_PAUSE_MS)
    probes = min(probes, calls)
    lags: list[float] = []
    meter = _CpuMeter(server)
    sipp = SippRun(sip_port, calls - probes, seconds + ramp, question, work, ramp)
    peers = [Probe(("127.0.0.1", sip_port)) for _ in range(probes)]
    lag_watch = TaskSet("sip-bench:loop-lag")
    lag_watch.create_task(_loop_lag(lags))
    try:
        await sipp.start()
        await asyncio.sleep(ramp)
        meter.start()
        lags.clear()
        await asyncio.gather(*(p.dial() for p in peers))
        answered_at = time.monotonic()
        async with TaskSet("sip-bench:talkers") as talkers:
            for p in peers:
                talkers.create_task(_talk(p, question))
            await asyncio.sleep(seconds)
    finally:
        await asyncio.gather(*(p.hang_up() for p in peers), return_exceptions=True)
        sipp_result = await sipp.finish()
        server_cpu, loop_cpu, server_wait = meter.stop()
        await lag_watch.close()
    late = received = audible = 0
    gaps: list[float] = []
    for p in peers:
        gaps += p.gaps(since=answered_at + 1.0)
        audible += len(p.loud_times(since=answered_at))
        # from one second after the answer: the first packets race the latch onto our port
        n_late, n = p.late_gaps(since=answered_at + 1.0)
        late, received = late + n_late, received + n
    expected = probes * (seconds - 1.0) / 0.02
    return {
        "calls": calls,
        "sipp_calls": calls - probes,
        "probe_calls": probes,
        "ramp_s": ramp,
        "answered": sipp_result.successful + sum(p.answered or bool(p.arrivals) for p in peers),
        "sipp_failed": sipp_result.failed,
        "probe_packets": received,
        "probe_packets_expected": round(expected),
        "probe_audible_pct": round(100 * audible / max(received, 1), 1),
        "late_packets_pct": round(100 * late / max(received, 1), 2),
        "gap_p99_ms": round(1000 * float(np.percentile(gaps, 99)) if gaps else 0.0, 1),
        "gap_max_ms": round(1000 * max(gaps, default=0.0), 1),
        "server_cpu_pct": round(server_cpu, 1),
        "server_loop_cpu_pct": round(loop_cpu, 1),
        "server_loop_runqueue_wait_pct": round(server_wait, 1),
        "sipp_cpu_pct": round(sipp_result.cpu_pct, 1),
        "loop_lag_max_ms": round(1000 * max(lags, default=0.0), 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "loop_lag_p99_ms": round(1000 * float(np.percentile(lags, 99)) if lags else 0.0, 1),
    }


async def barge_in(sip_port: int, trials: int) -> dict[str, Any]:
    """One call: ask, hear 300 ms of the answer, speak over it; first sample -> last audio."""
    question, stop = _speech()
    probe = Probe(("127.0.0.1", sip_port))
    latencies: list[float] = []
    await probe.dial()
    try:
        for _ in range(trials):
            asked = await probe.say(question)
            async with asyncio.timeout(15):
                await probe.hear(15, since=asked)
            cut = await probe.say(stop)
            # the answer to the interruption cannot start before the interruption ends
            old = probe.loud_times(since=cut, until=cut + len(stop) / 8000)
            latencies.append(1000 * ((old[-1] if old else cut) - cut))
            await _quiet(probe, 1.5)
    finally:
        await probe.hang_up()
    return {
        "trials": trials,
        "barge_in_p50_ms": round(float(np.percentile(latencies, 50)), 1),
        "barge_in_p95_ms": round(float(np.percentile(latencies, 95)), 1),
        "barge_in_ms": [round(x, 1) for x in latencies],
    }


async def _quiet(probe: Probe, seconds: float) -> None:
    """Wait until no audible packet has arrived for `seconds` (the echo answer is over)."""
    async with asyncio.timeout(30):
        while True:
            loud = probe.loud_times(since=time.monotonic() - seconds)
            if not loud and time.monotonic() - probe.arrivals[-1] < 0.1:
                return
            await asyncio.sleep(0.05)


async def run(
    steps: list[int], seconds: float, probes: int, trials: int, work: Path, ramp: float = 1.0
) -> dict[str, Any]:
    with sip_server(max(steps) + 2) as (server, sip_port):
        results = [await step(server, sip_port, n, seconds, probes, work, ramp) for n in steps]
        barge = await barge_in(sip_port, trials) if trials else {}
    return {"steps": results, "barge_in": barge, "cores": psutil.cpu_count()}


def table(report: dict[str, Any]) -> str:
    cols = ["calls", "answered", "late_packets_pct", "gap_p99_ms", "gap_max_ms"]
    cols += ["server_cpu_pct", "server_loop_cpu_pct", "server_loop_runqueue_wait_pct"]
    cols += ["sipp_cpu_pct"]
    cols += ["loop_lag_max_ms", "load_average_1m"]
    lines = [" | ".join(cols)]
    lines += [" | ".join(str(s[c]) for c in cols) for s in report["steps"]]
    barge = report["barge_in"]
    if barge:
        lines.append(
            f"barge-in over RTP ({barge['trials']} trials): p50 {barge['barge_in_p50_ms']} ms, "
            f"p95 {barge['barge_in_p95_ms']} ms (first interrupting sample -> last answer packet)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="SIP calls held, and barge-in over RTP")
    parser.add_argument("--calls", default="1,10,20,30", help="concurrent calls per step")
    parser.add_argument("--seconds", type=float, default=20.0, help="each step's calls held")
    parser.add_argument("--probes", type=int, default=2, help="measuring calls per step")
    parser.add_argument(
        "--ramp", type=float, default=1.0, help="seconds over which sipp places a step's calls"
    )
    parser.add_argument("--trials", type=int, default=10, help="barge-in trials (0: none)")
    parser.add_argument(
        "--json", type=Path, help="write the figures here, e.g. loadtest/results/NAME.json"
    )
    args = parser.parse_args(argv)
    steps = [int(n) for n in args.calls.split(",")]
    with tempfile.TemporaryDirectory(prefix="sip_bench") as tmp:
        report = asyncio.run(
            run(steps, args.seconds, args.probes, args.trials, Path(tmp), args.ramp)
        )
    report["seconds"] = args.seconds
    print(table(report))
    if args.json:  # the commit with it, so a chart drawn from it can say where it came from
        stamped = {**report, "date": time.ctime(), **source_stamp()}
        args.json.write_text(json.dumps(stamped, indent=2) + "\n")


if __name__ == "__main__":
    main()
