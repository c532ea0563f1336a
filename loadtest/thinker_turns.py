"""The Thinker's turns, phase by phase, read back from a server's log.

Each Qwen3-Omni Thinker turn logs where its time went before its first token
(`pipeline/engines/qwen3_omni/prefill_timeline.py`, at `info`): the row, the prompt built,
the wait for the model thread, the media towers, the prefill's chunks, the first token. The
serve benchmark keeps their distributions in its report (`header.thinker_turns`), so that
a GPU run through the server says what the end of a turn still costs.

    python -m loadtest.thinker_turns /tmp/omni-serve-bench-*/server.log
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from .serve_figures import distribution

PHASES = ("row", "prompt", "queued", "towers", "chunks", "first_token", "in_all")
_LINE = re.compile(
    r"thinker turn .*?: row (?P<row>[\d.]+), prompt (?P<prompt>[\d.]+), "
    r"queued (?P<queued>[\d.]+), towers (?P<towers>[\d.]+), "
    r"chunks (?P<chunks>[\d.]+) \((?P<chunk_count>\d+)\), "
    r"first token (?P<first_token>[\d.]+), in all (?P<in_all>[\d.]+) ms; "
    r"(?P<new>\d+) new positions, (?P<staged>\d+) staged while spoken; "
    r"batch of (?P<batch>\d+), (?P<positions>\d+) positions"
)


def parse_line(line: str) -> dict[str, float] | None:
    """One turn's figures (ms, and counts), or None for any other line."""
    found = _LINE.search(line)
    if found is None:
        return None
    return {name: float(value) for name, value in found.groupdict().items()}


def turns(text: str) -> list[dict[str, float]]:
    return [t for line in text.splitlines() if (t := parse_line(line)) is not None]


def summary(found: list[dict[str, float]]) -> dict[str, Any]:
    """Per phase (and the positions prefilled at the turn's end, those staged ahead, the
    batch): n, p50, p95, p99, max, mean."""
    if not found:
        return {"turns": 0}
    keys = (*PHASES, "new", "staged", "batch", "chunk_count")
    return {"turns": len(found), **{k: distribution([t[k] for t in found]) for k in keys}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="server logs")
    args = parser.parse_args(argv)
    found = [t for log in args.logs for t in turns(log.read_text(errors="replace"))]
    print(json.dumps(summary(found), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
