"""Where a Thinker turn's time goes before its first token (`turn_phases.py`'s line).

First audio is decided before the Talker hears anything: the Thinker's turn waits for a
row, builds its prompt (log-mel features, patches, ids) on a prep thread, waits for the
model thread, runs the media towers, prefills its new positions in chunks, and chooses its
first token. Figures through the server only say the sum (`parley_stage_first_chunk_seconds`);
its line says each part, on the GPU as on the CPU (docs/engines/streamed-prefill.md).

The model-thread phases are marked where they are run: on CUDA by events on the device's
current stream, read once the prefill's last call has synchronised (it copies states to the
host), so a phase is the device's own time and adds no synchronisation; elsewhere by the
host's clock. Between two chunks the decode steps of other sessions' answers run (decode
first), so `chunks` is the span from the first chunk's start to the last one's end, theirs
included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ...turn_phases import log_phases, since_ms


@dataclass(frozen=True, slots=True)
class PrefillTimes:
    """One prefill batch's model-thread phases (ms), and its size."""

    taken_at: float
    """When the model thread took the batch (`time.perf_counter`)."""
    towers_ms: float
    """Plan, media towers and merge, the rows' pasts laid side by side."""
    chunks_ms: float
    finish_ms: float
    """The rows' caches split, first tokens chosen, hidden states to the host."""
    chunks: int
    rows: int
    positions: int
    """New positions over every row of the batch."""
    row_positions: int = 0
    """This turn's own new positions (its row's)."""


class PhaseMarks:
    """Marks taken on the model thread between a prefill's phases."""

    def __init__(self, device: torch.device) -> None:
        self.taken_at = time.perf_counter()
        self._cuda = device.type == "cuda"
        self._device = device
        self._events: list[torch.cuda.Event] = []
        self._clock: list[float] = []
        self.mark()

    def mark(self) -> None:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(self._device))
            self._events.append(event)
        else:
            self._clock.append(time.perf_counter())

    def spans_ms(self) -> list[float]:
        """Between each two marks, ms (on CUDA: waits for the last mark's work)."""
        if self._cuda:
            self._events[-1].synchronize()
            pairs = zip(self._events, self._events[1:], strict=False)
            return [float(a.elapsed_time(b)) for a, b in pairs]
        return [(b - a) * 1000 for a, b in zip(self._clock, self._clock[1:], strict=False)]

    def times(self, *, chunks: int, rows: int, positions: int) -> PrefillTimes:
        """Marks taken at the start, after the towers, after each chunk, after the finish."""
        spans = self.spans_ms() or [0.0]  # a figure for the log: never a reason to fail
        return PrefillTimes(
            taken_at=self.taken_at,
            towers_ms=spans[0],
            chunks_ms=sum(spans[1:-1]),
            finish_ms=spans[-1] if len(spans) > 1 else 0.0,
            chunks=chunks,
            rows=rows,
            positions=positions,
        )


def whole(taken_at: float, positions: int) -> PrefillTimes:
    """A prompt prefilled alone in one call (a retry one prompt at a time): all of it
    `chunks`."""
    ms = since_ms(taken_at, time.perf_counter())
    return PrefillTimes(
        taken_at, 0.0, ms, 0.0, chunks=1, rows=1, positions=positions, row_positions=positions
    )


def log_turn(
    name: str,
    *,
    began: float,
    row_at: float,
    built_at: float,
    submitted_at: float,
    first_at: float,
    times: PrefillTimes,
    staged: int,
) -> None:
    """One turn's line (`turn_phases.py`): from the request in to its first token (ms)."""
    log_phases(
        "thinker",
        name,
        {
            "row": since_ms(began, row_at),
            "prompt": since_ms(row_at, built_at),
            "queued": since_ms(submitted_at, times.taken_at),
            "towers": times.towers_ms,
            "chunks": times.chunks_ms,
            "chunk_count": times.chunks,
            "first_token": times.finish_ms,
            "in_all": since_ms(began, first_at),
            "new": times.row_positions,
            "staged": staged,
            "batch": times.rows,
            "positions": times.positions,
        },
    )
