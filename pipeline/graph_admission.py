"""One admission for a whole turn-based graph: a turn enters only when every stage has a row
for it.

Each GPU stage has its own row gate (`row_gate.py`), which holds a turn to that stage's rows.
Alone, those gates let a graph take more turns than it can carry end to end: on one H200 at
64 sessions asking at once (32 rows a stage, 32 more waiting at each), the waiting turns got
Thinker rows as soon as the first 32 replies had been chosen, and their prefills and decodes
ran while the first 32 answers were still being spoken, on the same GPU: the Talker and
Code2Wav fell behind real time (stall p95 6.2 s; docs/engines/capacity.md). A turn that
holds a Thinker row is promised a Talker row too, and nothing kept that promise.

Here a turn takes one graph row before its first stage runs and gives it back when its
answer is made (the graph's output ended, however it ended), so at most `rows` turns are in
the graph at once, `rows` the fewest of any of its turn-holding stages: the admitted turns
see the stages as a round of `rows` sessions does, and the rest wait in front of the graph
(first come first served, `waiting` of them for at most `wait_s`, as a stage's gate) and
then run, or fail `server_busy`. The stages' own gates still stand behind it (a row a stage
gives back a moment after the turn's end is waited for there, not refused).

None where it would hold nothing: a graph with fewer than two turn-holding stages (one gate
is already the graph's), and one with a stage that may serve other server processes too (a
stage host of `--workers N`, a remote `parley stage`): one process cannot count its rows
alone, so the stages' gates hold the turns, as before.
"""

from __future__ import annotations

import logging

from .capacity import PipelineCapacity, RowLoad
from .row_gate import RowGate, RowsBusy
from .types import ErrorChunk

log = logging.getLogger("parley.pipeline.graph")

STAGE = "graph"
"""The name under which the graph's own rows are reported (metrics, `server_busy` errors)."""


class GraphAdmission:
    def __init__(self, rows: int, *, waiting: int, wait_s: float, bottleneck: str) -> None:
        self.gate = RowGate("the graph", rows, waiting=waiting, wait_s=wait_s)
        self.bottleneck = bottleneck
        """The stage with the fewest rows, whose figure the graph's rows are."""

    @staticmethod
    def of(capacity: PipelineCapacity | None) -> GraphAdmission | None:
        """The admission for a graph stating `capacity`, or None where it would hold nothing
        (see the module's docstring)."""
        if capacity is None:
            return None
        turns = [stage for stage in capacity.stages if stage.capacity.holds == "turn"]
        if len(turns) < 2 or any(stage.shared for stage in turns):
            return None
        fewest = min(turns, key=lambda stage: stage.capacity.rows)
        rows = fewest.capacity.rows
        sessions = min(stage.capacity.sessions for stage in turns)
        wait_s = max(stage.capacity.wait_s for stage in turns)
        admission = GraphAdmission(
            rows, waiting=max(0, sessions - rows), wait_s=wait_s, bottleneck=fewest.capacity.stage
        )
        log.info(
            "graph admission: %d turns in the graph at once (%s's rows), %d more wait up to "
            "%g s in front of it",
            rows,
            fewest.capacity.stage,
            admission.gate.waiting,
            wait_s,
        )
        return admission

    async def enter(self, request_id: str) -> ErrorChunk | bool:
        """Before a turn's first stage runs: True once it holds a graph row, an ErrorChunk
        (`server_busy`) when none came in time or the queue was full, False when it was
        abandoned while it waited. CancelledError leaves the queue holding nothing."""
        try:
            return await self.gate.take(request_id)
        except RowsBusy as exc:
            return ErrorChunk(str(exc), STAGE, code="server_busy")

    def leave(self, request_id: str) -> None:
        """The turn's answer is made (or it failed, or was aborted): its row goes on to the
        oldest waiter. Idempotent."""
        self.gate.give_back(request_id)

    def load(self) -> RowLoad:
        return self.gate.load()

    def close(self) -> None:
        """Every waiting turn leaves. Idempotent."""
        self.gate.close()
