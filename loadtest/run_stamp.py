"""What a benchmark report says about the source it ran: commit, uncommitted files, start time.

On a machine that got the working tree without its git history (the device machine), the
commit git reports can be an older one: `PARLEY_COMMIT` names the real one.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any


def command_output(cmd: list[str]) -> str:
    """A short command's stdout, or why it could not run (a report never fails on it)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return repr(exc)


def source_stamp() -> dict[str, Any]:
    return {
        "commit": os.environ.get("PARLEY_COMMIT") or command_output(["git", "rev-parse", "HEAD"]),
        "dirty_files": command_output(
            ["git", "status", "--porcelain", "--untracked-files=no"]
        ).splitlines(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
