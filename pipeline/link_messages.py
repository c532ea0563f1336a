"""What the two ends of a stage link say to each other.

The main process (`stage_client.LinkedStage`: a worker's or a remote stage's proxy) sends
`ToStage` messages; the serving side (`worker_main.serve_stage`) answers with `FromStage`
messages. Both sides dispatch with `match` on these classes. Every message is a frozen
dataclass that a link pickles with protocol 5, so the arrays inside chunks still travel out
of band (`connectors/base.py`) over either link, shared memory or Redis streams.

A request's life: `Generate`, then for a stream stage its upstream chunks as `Input` and an
`InputEnd`; back come `ChunkMessage`s and one `Done` once the engine's stream has ended
(normally, by an error, or aborted by `Abort`). A serving side says `Ready` when it can
serve (again, after riding out a link outage), with its capacity, or `Fatal` when its engine
cannot start; at every heartbeat it says `Alive` (with its capacity and its rows in use)
while its engine makes progress, or `Stuck` (with why)
while its engine's model thread is stuck in a step. `Stats` asks how many requests the engine holds;
`ForgetSession` passes on `Engine.forget_session` when a session ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .capacity import Capacity, RowLoad
from .gpu_usage import GpuUsage
from .types import Chunk, PipelineRequest

# --- to the stage ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Generate:
    """Start a request. `streamed`: a stream stage's; its upstream chunks follow as Input."""

    request_id: str
    request: PipelineRequest
    streamed: bool


@dataclass(frozen=True, slots=True)
class Input:
    """One upstream chunk of a streamed request."""

    request_id: str
    chunk: Chunk


@dataclass(frozen=True, slots=True)
class InputEnd:
    """The upstream of a streamed request has no more chunks."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class ForgetSession:
    """The session has ended: the engine drops what it kept for it between requests."""

    session_id: str


@dataclass(frozen=True, slots=True)
class OpenTurn:
    """A turn begins while the user speaks (`StreamingInput.open_turn`)."""

    turn_id: str
    context: PipelineRequest


@dataclass(frozen=True, slots=True)
class FeedTurn:
    """More of a streamed turn's audio (`StreamingInput.feed_turn`)."""

    turn_id: str
    pcm: npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class DropTurn:
    """A streamed turn is dropped (`StreamingInput.drop_turn`)."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class Stats:
    """Ask how many requests the engine holds; answered by a StatsReply with the same token."""

    token: int


@dataclass(frozen=True, slots=True)
class Close:
    """Stop serving (the main process is shutting the stage down)."""


ToStage = (
    Generate
    | Input
    | InputEnd
    | Abort
    | ForgetSession
    | OpenTurn
    | FeedTurn
    | DropTurn
    | Stats
    | Close
)


# --- from the stage ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The engine is loaded and requests are served (sent again after a link outage), with
    what it can serve (`Engine.capacity()`), so that the main process's graph, and its
    admission, count the stage as if it ran there. `streams_input`: the engine takes turns
    streamed while the user speaks (`types.streams_input`)."""

    capacity: Capacity | None = None
    streams_input: bool = False


@dataclass(frozen=True, slots=True)
class Alive:
    """The heartbeat: the serving side's loop runs and its engine makes progress. Its
    absence tells what no link can: the other side is stopped (SIGSTOP, a hung host) or,
    over Redis, gone. It carries the engine's capacity (a remote stage may be first heard
    by its heartbeat) and its rows now, for the main process's metrics; for an engine that
    takes streamed turns, how they ended so far (`StreamingInput.streamed_turns`; None for
    any other engine); for a process that started CUDA, its GPU memory (`gpu_usage.py`)."""

    capacity: Capacity | None = None
    load: RowLoad | None = None
    streamed: dict[str, int] | None = None
    gpu: GpuUsage | None = None


@dataclass(frozen=True, slots=True)
class Stuck:
    """The heartbeat of a stage whose loop runs but whose engine has made no progress
    within its bound (`Engine.stalled`); the main process treats the stage as hung.
    `broken`: the engine broke for good (`Engine.broken`) and its process is exiting by
    itself (the main process need not kill it)."""

    reason: str
    broken: bool = False


@dataclass(frozen=True, slots=True)
class Fatal:
    """The engine could not be built or started; the serving side stops."""

    message: str


@dataclass(frozen=True, slots=True)
class ChunkMessage:
    """One chunk of a request's output."""

    request_id: str
    chunk: Chunk


@dataclass(frozen=True, slots=True)
class Done:
    """The request's stream has ended on the serving side; nothing more comes for it."""

    request_id: str


@dataclass(frozen=True, slots=True)
class StatsReply:
    token: int
    active_requests: int


FromStage = Ready | Alive | Stuck | Fatal | ChunkMessage | Done | StatsReply
