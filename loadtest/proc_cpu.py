"""CPU time of a server's processes, read from /proc: the benches' common measure.

With `--workers` the process a bench started only supervises; the sessions are served by
its children, and the embedded Redis is a child too (reported apart). A process that ends
while the tree is walked is left out.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def stat_fields(path: str) -> list[str]:
    """The fields of a /proc `stat` file after the command's name (fields[0] is the state,
    field 3 of proc(5)); OSError once the process has ended."""
    return Path(path).read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time of process `pid`, or of its thread `tid` (the main thread, tid == pid,
    runs the event loop: what it spends per frame is what late frames depend on)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = stat_fields(path)
    return (int(fields[11]) + int(fields[12])) / TICKS


def start_ticks(pid: int) -> int:
    """When `pid` started, in clock ticks since boot (0 once it has ended)."""
    try:
        return int(stat_fields(f"/proc/{pid}/stat")[19])
    except OSError:
        return 0


def process_group(pid: int) -> int | None:
    """`pid`'s process group (None once it has ended)."""
    try:
        return int(stat_fields(f"/proc/{pid}/stat")[2])
    except OSError:
        return None


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
