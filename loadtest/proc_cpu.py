"""CPU time of a server's processes, read from /proc: the benches' common measure.

With `--workers` the process a bench started only supervises; the sessions are served by
its children, and the embedded Redis is a child too (reported apart). A process that ends
while the tree is walked is left out.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time of process `pid`, or of its thread `tid` (the main thread, tid == pid,
    runs the event loop: what it spends per frame is what late frames depend on)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def tree(pid: int) -> list[int]:
    """`pid` and every process under it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue  # ended meanwhile
        found.append(current)
    return found


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ("" once it has ended)."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def is_redis(pid: int) -> bool:
    return "redis-server" in cmdline(pid)
