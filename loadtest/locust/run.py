"""Step test and churn against `parley serve`, with Locust headless in a child process, and the
report (report.json + report.html) at the end.

    .venv/bin/python -m loadtest.locust.run --protocol ws --steps 1,5,10 --step-s 20 --report out/
    .venv/bin/python -m loadtest.locust.run --protocol webrtc --steps 5,10,20,30 --report out/
    .venv/bin/python -m loadtest.locust.run --churn 300 --churn-rounds 3 --report out/churn

Without `--url` it starts `parley serve --pipeline echo` on a redis-server of its own. Each
step runs `locust --headless -u N` for `--step-s`; under `report/step-N/` it leaves Locust's
own reports under stable names (`--csv`: `locust_stats.csv`, `locust_stats_history.csv`,
`locust_failures.csv`, `locust_exceptions.csv`; `--html`: `locust.html`), its log
`locust.log`, and our exact samples. The run stops at the first step that breaks a target
(report.TARGETS), unless `--keep-going`.
Locust runs in a child process so its gevent patching never touches this one; with
`--processes K` Locust itself forks K workers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..served import free_port
from . import report as reports
from .churn_mode import churn_mode
from .header import header
from .quality import quality
from .stats import merge
from .target import Sampler, metrics, own_redis, serve

USERS = {"ws": "WsUser", "webrtc": "RtcUser", "video": "VideoUser", "sip": "SipUser"}
PROTOCOLS = {"ws": "WS", "webrtc": "WebRTC", "video": "VIDEO", "sip": "SIP"}
LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def locust_step(
    args: argparse.Namespace,
    url: str,
    users: int,
    folder: Path,
    seconds: float,
    sampler: Sampler | None,
) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("samples-*.json"), *folder.glob("clip*")]:
        old.unlink()  # an earlier run's
    rate = args.spawn_rate or max(1.0, users / 5)
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary"]
    cmd += ["-u", str(users), "-r", str(rate), "-t", f"{seconds:.0f}s", "--host", url]
    cmd += ["--csv", str(folder / "locust"), "--html", str(folder / "locust.html")]
    cmd += ["--samples-dir", str(folder)]
    cmd += ["--turns", str(args.turns), "--barge-every", str(args.barge_every)]
    cmd += ["--exit-code-on-error", "0", "--sip-port", str(args.sip_port)]
    if args.processes > 1:
        cmd += ["--processes", str(args.processes)]
    cmd += [USERS[p] for p in _protocols(args)]
    with (folder / "locust.log").open("w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=LOCUSTFILE.parents[2],
            start_new_session=True,  # its workers share its process group
        )
        if sampler is not None:
            sampler.generator_pid = proc.pid
        try:
            return proc.wait(seconds + 120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            with contextlib.suppress(ProcessLookupError):  # a worker left behind
                os.killpg(proc.pid, signal.SIGKILL)


def _means(rows: list[dict[str, float]]) -> dict[str, float]:
    """A step's resource samples averaged (RSS: its largest)."""
    keys = {k for row in rows for k in row} - {"t", "step"}
    out = {}
    for key in sorted(keys):
        values = [row[key] for row in rows if key in row]
        out[key] = round(max(values) if "rss" in key else sum(values) / len(values), 1)
    return out


def _protocols(args: argparse.Namespace) -> list[str]:
    return [p for p in args.protocol.split(",") if p]


PER_PROCESS = {"webrtc": 30, "ws": 150, "video": 150, "sip": 300}
"""About how many users one Locust process holds: ~30 aiortc calls; WebSocket users that
stream their microphone (50 appends a second each) took 86 % of a core at 200 (measured
2026-12-02 on the 2-core machine), so ~150, not the ~1,000 idle ones the issue quotes."""


def _capacity_warning(args: argparse.Namespace, users: int) -> str | None:
    most = min(PER_PROCESS[p] for p in _protocols(args)) * args.processes
    if users <= most:
        return None
    return (
        f"{users} users over {args.processes} Locust process(es) holding ~{most}: add --processes"
    )


def steps(args: argparse.Namespace, url: str, sampler: Sampler | None) -> dict[str, Any]:
    out_dir: Path = args.report
    if args.warmup_s > 0:
        locust_step(args, url, 1, out_dir / "warmup", args.warmup_s, None)
    rows: list[dict[str, Any]] = []
    first_failed = None
    for users in [int(s) for s in args.steps.split(",") if s]:
        folder = out_dir / f"step-{users}"
        if warning := _capacity_warning(args, users):
            print(f"warning: {warning}", flush=True)
        before = metrics(url)
        if sampler is not None:
            sampler.step = users
        rc = locust_step(args, url, users, folder, args.step_s, sampler)
        after = metrics(url)
        server = {k: after[k] - before[k] for k in after}
        samples, counters = merge(folder)
        protocols = [PROTOCOLS[p] for p in _protocols(args)]
        row = reports.step(users, protocols, samples, counters, server)
        row["locust_exit_code"] = rc
        row["generator_warning"] = warning
        row["resources"] = _means(
            [r for r in sampler.rows if r["step"] == users] if sampler else []
        )
        rows.append(row)
        verdict = "ok" if row["ok"] else "FAIL"
        if row["generator_overloaded"]:
            verdict += " (the load generator's own loop was late: figures suspect)"
        checks = ", ".join(f"{k} {c['value']:g}" for k, c in row["checks"].items())
        print(f"{users:4d} users: {verdict}: {checks}; {row['resources']}", flush=True)
        if not row["ok"]:
            first_failed = first_failed or users
            if not args.keep_going:
                break
    dirs = [out_dir / f"step-{s['users']}" for s in rows]
    return {"steps": rows, "first_failed": first_failed, "quality": quality(dirs, args.asr)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before = [round(x, 2) for x in os.getloadavg()]  # a busy machine skews every figure
    top = max([int(s) for s in args.steps.split(",") if s] + [8])
    with contextlib.ExitStack() as stack:
        if args.url:
            url, pid, redis_url = args.url.rstrip("/"), None, None
        else:
            redis_url = stack.enter_context(own_redis())
            if "sip" in _protocols(args):
                args.sip_port = free_port(socket.SOCK_DGRAM)
            extra = ["--sip-port", str(args.sip_port)] if args.sip_port else []
            extra += ["--workers", args.workers]
            cap = top * args.processes + 16
            served = stack.enter_context(serve(args.pipeline, cap, redis_url, extra))
            url, pid = served.http_url, served.process.pid
        sampler = stack.enter_context(Sampler(pid)) if pid is not None else None
        result: dict[str, Any] = {}
        if args.churn:
            if pid is None or redis_url is None:
                raise SystemExit("--churn measures the server it starts: leave out --url")
            result["churn"] = churn_mode(args, url, pid, redis_url)
        else:
            result.update(steps(args, url, sampler))
        result["timeline"] = sampler.rows if sampler is not None else []
    result["header"] = header(
        args.pipeline,
        protocol=args.protocol,
        steps=args.steps,
        step_s=args.step_s,
        warmup_s=args.warmup_s,
        processes=args.processes,
        server_workers=args.workers,
        turns_per_session=args.turns,
        barge_every=args.barge_every,
        input_set=(
            "one question, 'What is the weather going to be like tomorrow in Boston?', spoken "
            "by Piper's joe voice (trimmed); every user asks it each turn; interruptions say "
            "'Hold on, stop.'; think time 1-3 s between sessions"
        ),
        url=args.url or "parley serve started by the runner",
        started_at=started,
        load_average_before=load_before,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Locust step test / churn with a report")
    parser.add_argument(
        "--protocol", default="ws", help="ws, webrtc, video, sip, or several: ws,webrtc"
    )
    parser.add_argument("--steps", default="1,5,10,20,30", help="users per step")
    parser.add_argument("--step-s", type=float, default=30.0)
    parser.add_argument("--spawn-rate", type=float, default=0.0, help="default: users / 5 s")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="one user, not counted")
    parser.add_argument("--turns", type=int, default=2, help="questions per session")
    parser.add_argument("--barge-every", type=int, default=3)
    parser.add_argument(
        "--keep-going", action="store_true", help="run every step, even after one fails"
    )
    parser.add_argument("--processes", type=int, default=1, help="Locust worker processes")
    parser.add_argument("--pipeline", default="echo")
    parser.add_argument("--workers", default="1", help="parley serve --workers (N or auto)")
    parser.add_argument("--url", help="a running server (http://HOST:PORT); else one is started")
    parser.add_argument("--sip-port", type=int, default=0, help="with --url: its SIP port")
    parser.add_argument("--asr", choices=("whisper", "pocketsphinx", "none"), default="whisper")
    parser.add_argument("--churn", type=int, default=0, help="churn mode: this many WS sessions")
    parser.add_argument("--churn-concurrency", type=int, default=4)
    parser.add_argument("--churn-rounds", type=int, default=3)
    parser.add_argument("--report", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    if not _protocols(args) or set(_protocols(args)) - set(USERS):
        parser.error(f"--protocol: one or more of {', '.join(USERS)}, comma separated")
    result = run(args)
    json_path, html_path = reports.write(args.report, result)
    print(f"report: {json_path} {html_path}")


if __name__ == "__main__":
    main()
