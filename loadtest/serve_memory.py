"""Memory of a whole `parley serve --workers N` once it is ready, by kind of process.

Memory is PSS (proportional set size, /proc/PID/smaps_rollup): a page shared by k processes
counts 1/k in each, so the sum over the tree is what the server costs the machine, with a
model's memory-mapped weights counted once however many processes map them. Each row is one
server started, left to settle, measured and stopped; `--stage-hosts on` (the default) loads
each worker-placed stage once for every worker, `off` once per worker.

    .venv/bin/python -m loadtest.serve_memory --workers 1,2 --stage-hosts on,off
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from .proc_cpu import cmdline, tree
from .served import parley_serve

KINDS = (
    ("pipeline.stage_host", "stage hosts"),
    ("pipeline.worker_main", "stage workers"),
    ("redis-server", "redis"),
    ("multiprocessing.resource_tracker", "other"),
    ("--worker-index", "server workers"),
)


def pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass  # ended meanwhile
    return 0


def kind_of(pid: int, root: int) -> str:
    if pid == root:
        return "parent"
    command = cmdline(pid)
    return next((kind for marker, kind in KINDS if marker in command), "other")


def measure(pipeline: str, workers: int, hosts: str, settle_s: float) -> Counter[str]:
    options = ["--pipeline", pipeline, "--workers", str(workers), "--stage-hosts", hosts]
    with parley_serve(*options) as served:
        time.sleep(settle_s)
        root = served.process.pid
        by_kind: Counter[str] = Counter()
        for pid in tree(root):
            by_kind[kind_of(pid, root)] += pss_kb(pid)
    return by_kind


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="cascade")
    parser.add_argument("--workers", default="1,2", help="comma list")
    parser.add_argument("--stage-hosts", default="on,off", help="comma list of on/off")
    parser.add_argument("--settle-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    columns = ["parent", "server workers", "stage hosts", "stage workers", "redis", "other"]
    print(f"PSS in MB once ready, pipeline {args.pipeline}")
    print(f"  {'workers':>7} {'hosts':>5} {'total':>7} " + " ".join(f"{c:>14}" for c in columns))
    for n in (int(w) for w in args.workers.split(",")):
        for hosts in args.stage_hosts.split(","):
            if n == 1 and hosts == "off":
                continue  # one process: no hosts either way
            got = measure(args.pipeline, n, hosts, args.settle_s)
            total = sum(got.values())
            cells = " ".join(f"{got[c] / 1024:>14.0f}" for c in columns)
            print(f"  {n:>7} {hosts:>5} {total / 1024:>7.0f} {cells}", flush=True)


if __name__ == "__main__":
    main()
