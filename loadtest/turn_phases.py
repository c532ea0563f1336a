"""Each stage's turns, phase by phase, read back from a server's log.

A stage that knows where a turn's time goes before its first output logs one line a turn
(`pipeline/turn_phases.py`, at `info`): the Qwen3-Omni Thinker (row, prompt built, queued,
towers, prefill chunks, first token) and Talker (the Thinker's prompt, its first reply
token, row, prefill, first frame). The serve benchmark keeps their distributions in its
report (`header.turn_phases`), so that a GPU run through the server says what the end of a
turn still costs, stage by stage.

    python -m loadtest.turn_phases /tmp/omni-serve-bench-*/server.log
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from .serve_figures import distribution

_LINE = re.compile(r"\b(?P<stage>\w+) turn (?P<name>.+?): (?P<pairs>(?:\w+=[-\d.]+ ?)+)$")


def parse_line(line: str) -> tuple[str, dict[str, float]] | None:
    """A turn line's stage and figures, or None for any other line."""
    found = _LINE.search(line.rstrip())
    if found is None:
        return None
    pairs = (pair.split("=", 1) for pair in found["pairs"].split())
    return found["stage"], {key: float(value) for key, value in pairs}


def turns(text: str) -> dict[str, list[dict[str, float]]]:
    """Per stage, its turns' figures in the order logged."""
    found: dict[str, list[dict[str, float]]] = {}
    for line in text.splitlines():
        if (parsed := parse_line(line)) is not None:
            found.setdefault(parsed[0], []).append(parsed[1])
    return found


def summary(found: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Per stage: its turns, and per figure n, p50, p95, p99, max, mean."""
    out: dict[str, Any] = {}
    for stage, rows in found.items():
        keys = dict.fromkeys(key for row in rows for key in row)
        figures = {key: distribution([row[key] for row in rows if key in row]) for key in keys}
        out[stage] = {"turns": len(rows), **figures}
    return out


def p50_lines(summed: dict[str, Any]) -> list[str]:
    """One line a stage: its turns and each figure's p50, as a run's last lines say them."""
    lines = []
    for stage, figures in summed.items():
        p50s = " ".join(
            f"{key}={value['p50']:g}"
            for key, value in figures.items()
            if isinstance(value, dict) and "p50" in value
        )
        lines.append(f"{stage} turns ({figures['turns']}), p50: {p50s}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="server logs")
    args = parser.parse_args(argv)
    text = "\n".join(log.read_text(errors="replace") for log in args.logs)
    summed = summary(turns(text))
    print(json.dumps(summed, indent=1))
    print("\n".join(p50_lines(summed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
