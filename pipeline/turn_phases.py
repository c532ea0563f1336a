"""One log line a turn and stage, saying where the turn's time went before its first output.

Figures through the server say only sums (`parley_stage_first_chunk_seconds`); a stage that
knows its own phases logs them here, at `info`, as `<stage> turn <name>: key=value ...`
(milliseconds for times, counts for the rest), so that any served run shows what a turn's
end still costs on the card it ran on. `loadtest.turn_phases` reads the lines back; the
serve benchmark keeps their distributions in its report.
"""

from __future__ import annotations

import logging

log = logging.getLogger("parley.pipeline.turn_phases")


def log_phases(stage: str, name: str, figures: dict[str, float]) -> None:
    """`stage turn name: key=value ...`, times to a tenth of a millisecond."""
    if log.isEnabledFor(logging.INFO):
        pairs = " ".join(f"{key}={_text(value)}" for key, value in figures.items())
        log.info("%s turn %s: %s", stage, name, pairs)


def since_ms(start: float, end: float) -> float:
    """`end - start` in ms (perf_counter seconds in), never below zero."""
    return max(0.0, (end - start) * 1000)


def _text(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.1f}"
