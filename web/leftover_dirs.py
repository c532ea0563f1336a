"""Runtime directories left by servers that did not stop in order.

`parley serve` makes directories of its own in the temp directory: the embedded Redis's
(`parley-redis-*`: its socket, append-only file and log) and the stage hosts' sockets under
`--workers` (`parley-stages-*`). Each is removed when its owner stops. A server that never
ran its stop (killed with SIGKILL, or ended with `os._exit` after a sticky device error so
that its supervisor starts a fresh one) leaves them behind. Such a directory belongs to
nobody once the processes that own it are gone, so the next one made with the same prefix
removes it first (and the test suite does at its end).

Each directory names its owners in `owner`: the pid of the process that made it and any
child that serves from it (the redis-server). A directory without that file (one being made
this moment, or one from before the file existed) is removed only when it is older than
`UNOWNED_AGE_S` and no socket in it answers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

REDIS_PREFIX = "parley-redis-"
STAGES_PREFIX = "parley-stages-"
OWNER_FILE = "owner"
UNOWNED_AGE_S = 60.0


def write_owner(runtime_dir: Path, *children: int) -> None:
    """Record that this process (and `children`) own `runtime_dir`."""
    pids = " ".join(str(pid) for pid in (os.getpid(), *children))
    (runtime_dir / OWNER_FILE).write_text(pids + "\n")


def sweep_stale_dirs(prefix: str, parent: Path | None = None) -> list[Path]:
    """Remove the `prefix*` directories under `parent` (the temp directory) whose owners are
    all gone; returns what was removed."""
    removed = []
    for path in Path(parent or tempfile.gettempdir()).glob(prefix + "*"):
        if path.is_dir() and _stale(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _stale(path: Path) -> bool:
    try:
        pids = [int(p) for p in (path / OWNER_FILE).read_text().split()]
    except FileNotFoundError:
        return _unowned_and_silent(path)
    except (OSError, ValueError):
        return False  # not ours to judge: leave it
    return not any(_alive(pid) for pid in pids)


def _unowned_and_silent(path: Path) -> bool:
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return False
    if age < UNOWNED_AGE_S:
        return False
    return not any(_answers(sock) for sock in path.glob("*.sock"))


def _answers(sock: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(sock))
        except OSError:
            return False
    return True


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields and fields[0] == "Z":
            return False
    return True
