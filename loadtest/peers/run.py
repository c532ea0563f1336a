"""Run the peer comparison: each peer's server in turn, the same client, one table.

    .venv/bin/python -m loadtest.peers.setup              # once: the peers' venvs (PyPI)
    .venv/bin/python -m loadtest.peers.run [--peer parley,fastrtc,pipecat]
        [--tests connect,turn,barge,capacity] [--quick] [--out test-artifacts/peers]

Peers run one after another, never together (server and client share the cores). Parley is
`parley serve --pipeline echo`; FastRTC and Pipecat answer with a tone as long as the echo's
answer (bots/reply.py says why that is the fair match). Writes `<out>/<peer>.json` (raw
values, figures, counts, versions) and `<out>/table.md` (ratios to Parley from this run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.peers import capacity as cap
from loadtest.peers import measures
from loadtest.peers.client import PEERS
from loadtest.peers.report import figures, table
from loadtest.peers.servers import ROOT, Server, serve

TESTS = ("connect", "turn", "barge", "capacity")
FULL = {"connect": 10, "turn": 20, "barge": 20, "steps": "1,5,10,15,20,30", "warm": 4.0}
FULL |= {"window": 20.0, "stagger": 9.0}
QUICK = {"connect": 3, "turn": 3, "barge": 3, "steps": "1,3", "warm": 2.0}
QUICK |= {"window": 8.0, "stagger": 3.0}


def _list(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{what}: choose from {', '.join(allowed)}")
    return chosen


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Parley vs FastRTC vs Pipecat, one client")
    parser.add_argument("--peer", default="parley,fastrtc,pipecat", help="comma-separated")
    parser.add_argument("--tests", default=",".join(TESTS), help="comma-separated")
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    for name in ("connect", "turn", "barge"):
        parser.add_argument(f"--{name}", type=int, help=f"{name} tries")
    parser.add_argument("--steps", help="capacity steps, e.g. 1,5,10")
    for name in ("warm", "window", "stagger"):
        parser.add_argument(f"--{name}", type=float, help=f"capacity {name} seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "peers")
    args = parser.parse_args(argv)
    try:
        args.peer = _list(args.peer, PEERS, "--peer")
        args.tests = _list(args.tests, TESTS, "--tests")
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.steps = tuple(int(s) for s in str(args.steps).split(",") if s)
    return args


async def measure(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        httpx.AsyncClient(base_url=server.probe_url, timeout=10) as probe,
    ):
        target = measures.Target(server.peer, http, probe)
        raw["start_rss_mb"] = (await target.stats())["rss_mb"]
        if "connect" in args.tests:
            raw["connect_ms"] = await measures.connect(target, args.connect)
        if "turn" in args.tests:
            raw["turn_ms"] = await measures.turn(target, args.turn)
        if "barge" in args.tests:
            raw["barge"] = await measures.barge(target, args.barge)
        if "capacity" in args.tests:
            plan = cap.Plan(args.steps, args.warm, args.window, args.stagger)
            raw["capacity"] = await cap.capacity(target, plan)
    return raw


def _commit() -> str:
    """HEAD, with "+dirty" when the work tree differs (Parley runs from the work tree)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True
    )
    dirty = "+dirty" if status.stdout.strip() else ""
    return (head.stdout.decode().strip() or "unknown") + dirty


def header(args: argparse.Namespace) -> dict[str, Any]:
    counts = {k: getattr(args, k) for k in ("connect", "turn", "barge", "warm", "window")}
    return {
        "run_at": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "commit": _commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "quick": args.quick,
        "tests": args.tests,
        "counts": counts | {"steps": list(args.steps), "stagger": args.stagger},
    }


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    reply_s = measures.question_seconds()
    results: dict[str, dict[str, Any]] = {}
    for peer in args.peer:
        print(f"peers: {peer} ...", file=sys.stderr, flush=True)
        try:
            with serve(peer, reply_s, args.out / f"{peer}.server.log") as server:
                raw = asyncio.run(measure(server, args))
        except (RuntimeError, SystemExit) as error:
            print(f"peers: {peer} not measured: {error}", file=sys.stderr, flush=True)
            continue
        record = header(args) | {"peer": peer, "reply_s": reply_s, "raw": raw}
        record["figures"] = figures(raw)
        (args.out / f"{peer}.json").write_text(json.dumps(record, indent=1))
        results[peer] = record["figures"]
    first = header(args)
    title = f"Run of {first['run_at']} at {first['commit']} on {first['cpus']} CPUs"
    text = title + (" (--quick: reduced counts)" if args.quick else "") + "\n\n" + table(results)
    (args.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
