"""What a GPU engine can serve, stated once it has started, and what admission reads.

vLLM sizes its KV cache after loading the weights and logs what that buys ("Maximum
concurrency for 32,768 tokens per request: 29.06x"); requests past it wait in its scheduler.
An engine here says the same (`Engine.capacity()`): how many requests (or sessions) it
decodes at once on its cache rows, how long one may be, what the rows cost, how many more
may wait for a row and for how long. The graph combines its stages' figures
(`PipelineCapacity`), and the server admits no more sessions than that.

`holds` is what a row is held for. A duplex model (Moshi) holds a row for a session's whole
life, so it can admit `rows` sessions. A turn-based graph (Qwen3-Omni) holds a row per turn
in flight: any number of sessions may be open, and a turn that finds every row taken waits
(at most `waiting` turns, each at most `wait_s`) and then fails with `server_busy`; so it
admits `rows + waiting` sessions, the most that can all be served in one round of turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Holds = Literal["turn", "session"]


@dataclass(frozen=True, slots=True)
class Capacity:
    """One stage's figures, stated at start (after its weights are loaded and rows sized)."""

    stage: str
    rows: int
    """Requests (`holds == "turn"`) or sessions (`"session"`) decoded at once."""
    context: int
    """Positions one row holds (prompt and reply together)."""
    holds: Holds = "turn"
    waiting: int = 0
    """Turns that may wait for a row at once (beyond them a turn fails at once)."""
    wait_s: float = 0.0
    """How long a turn waits for a row before it fails with `server_busy`."""
    memory_bytes: int = 0
    """Device memory the rows take (their KV), for the start-up line."""

    @property
    def sessions(self) -> int:
        """Sessions this stage can serve at once (see the module's docstring)."""
        return self.rows if self.holds == "session" else self.rows + self.waiting

    def __add__(self, other: Capacity) -> Capacity:
        """Two replicas of a stage as one: their rows and waiting places summed, the
        shorter context, the longer wait."""
        return Capacity(
            stage=self.stage,
            rows=self.rows + other.rows,
            context=min(self.context, other.context),
            holds=self.holds,
            waiting=self.waiting + other.waiting,
            wait_s=max(self.wait_s, other.wait_s),
            memory_bytes=self.memory_bytes + other.memory_bytes,
        )

    def line(self) -> str:
        """The start-up log line operators grep for."""
        memory = ""
        if self.memory_bytes >= 2**30:
            memory = f", {self.memory_bytes / 2**30:.1f} GiB of KV"
        elif self.memory_bytes:
            memory = f", {self.memory_bytes / 2**20:.1f} MiB of KV"
        per = "session" if self.holds == "session" else "turn in flight"
        waits = (
            f"; {self.waiting} more turns wait up to {self.wait_s:g} s for a row"
            if self.holds == "turn"
            else ""
        )
        return (
            f"{self.stage}: {self.rows} cache rows of {self.context:,} positions{memory}, "
            f"one per {per}{waits}: {self.sessions} sessions at once"
        )


@dataclass(frozen=True, slots=True)
class StageCapacity:
    """One stage of a graph: its engine's figures under the graph's name for the stage (a
    replicated stage's summed over its replicas), and whether every server process shares
    it (`shared`: a stage host or a remote stage serves all of `parley serve --workers N`;
    otherwise each server process runs its own, and N of them serve N times as many)."""

    capacity: Capacity
    shared: bool = False

    def sessions(self, processes: int = 1) -> int:
        return self.capacity.sessions * (1 if self.shared else processes)

    def line(self) -> str:
        return self.capacity.line() + (" (shared by every server process)" if self.shared else "")


@dataclass(frozen=True, slots=True)
class PipelineCapacity:
    """A graph's figures: the stages' own, and the sessions the whole graph can serve (the
    smallest of its stages', each times its replicas)."""

    stages: tuple[StageCapacity, ...]

    @property
    def sessions(self) -> int:
        """Sessions one server process's graph can serve."""
        return self.across(1)

    def across(self, processes: int) -> int:
        """Sessions `processes` server processes (each with this graph) serve together: a
        stage each process runs itself counts once per process, a shared one once."""
        return min(stage.sessions(processes) for stage in self.stages)

    def lines(self) -> list[str]:
        """Each stage's start-up line."""
        return [stage.line() for stage in self.stages]

    @staticmethod
    def of(stages: list[StageCapacity]) -> PipelineCapacity | None:
        """From each stage's figures; None when no stage states any (a graph without GPU
        engines: admission keeps its configured cap)."""
        return PipelineCapacity(tuple(stages)) if stages else None


@dataclass(frozen=True, slots=True)
class RowLoad:
    """An engine's rows now, for the metrics: rows held, turns waiting for one, and turns
    refused (`server_busy`) since the engine started."""

    in_use: int = 0
    waiting: int = 0
    refused: int = 0

    def __add__(self, other: RowLoad) -> RowLoad:
        return RowLoad(
            self.in_use + other.in_use, self.waiting + other.waiting, self.refused + other.refused
        )
