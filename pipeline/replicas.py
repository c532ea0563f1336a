"""A stage served by several replicas of its engine, one per device, sessions spread over them.

A graph file that places a stage on several devices (`placement.devices: [cuda:0, cuda:1]`)
gets one engine per device, each a worker process or a stage host of its own, and this
engine in front of them. More replicas serve more sessions at once; what a replica keeps
between a session's turns (the Thinker's KV of the conversation so far) is worth keeping,
so a session stays on the replica that served its first request:

* a new session goes to the replica with the fewest sessions (ties: the fewest requests in
  flight, then the first), so sessions spread evenly whatever their turns' timing;
* a request with no session (a bench's, an HTTP one-off) goes to the least busy replica and
  is placed nowhere;
* a replica that is down (`stalled`: its worker died and is restarting, or it is stuck)
  takes no new sessions, and a session placed on it moves to another one for its next
  request: what the old replica kept for it is lost, so that turn prefills in full, which
  beats failing it;
* `forget_session` (the session ended) goes to the replica that holds the session, and
  frees its place. The table of places is bounded: past `MAX_SESSIONS` the least recently
  used session is forgotten here (its replica drops its state by its own budget).

The choice is the `ReplicaChooser`'s, which knows nothing of engines, so it is tested on
its own; `StageReplicas` is the engine of either kind that the graph sees.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Collection, Sequence

from .capacity import Capacity, RowLoad
from .types import Chunk, Engine, EntryEngine, PipelineRequest, StageInput, StreamEngine

log = logging.getLogger("parley.pipeline.replicas")

MAX_SESSIONS = 65_536
"""Sessions whose replica is remembered; the least recently used is forgotten first."""


class ReplicaChooser:
    """Which replica serves each session: sticky, least loaded first, around those down."""

    def __init__(self, replicas: int, max_sessions: int = MAX_SESSIONS) -> None:
        if replicas < 1:
            raise ValueError("a stage has at least one replica")
        self.replicas = replicas
        self.max_sessions = max_sessions
        self._placed: OrderedDict[str, int] = OrderedDict()
        self._sessions = [0] * replicas
        """Sessions placed on each replica."""

    def sessions_on(self, replica: int) -> int:
        return self._sessions[replica]

    def placed(self, session_id: str) -> int | None:
        """The replica the session is placed on, if any."""
        return self._placed.get(session_id)

    def choose(
        self, session_id: str, busy: Sequence[int], down: Collection[int] = ()
    ) -> tuple[int, int | None]:
        """(the replica for the session's next request, the replica it leaves or None).

        `busy`: each replica's requests in flight; `down`: replicas that cannot serve now.
        With every replica down the session stays where it is (its request fails there,
        with that replica's reason)."""
        if len(busy) != self.replicas:
            raise ValueError(f"busy has {len(busy)} entries for {self.replicas} replicas")
        current = self._placed.get(session_id) if session_id else None
        if current is not None and (current not in down or len(down) >= self.replicas):
            self._placed.move_to_end(session_id)
            return current, None
        serving = [r for r in range(self.replicas) if r not in down] or list(range(self.replicas))
        if not session_id:
            return min(serving, key=lambda r: (busy[r], self._sessions[r], r)), None
        chosen = min(serving, key=lambda r: (self._sessions[r], busy[r], r))
        if current is not None:
            self._sessions[current] -= 1
        self._placed[session_id] = chosen
        self._placed.move_to_end(session_id)
        self._sessions[chosen] += 1
        while len(self._placed) > self.max_sessions:
            _, oldest = self._placed.popitem(last=False)
            self._sessions[oldest] -= 1
        return chosen, current

    def forget(self, session_id: str) -> int | None:
        """The session ended: the replica it was on (None if it was on none)."""
        replica = self._placed.pop(session_id, None)
        if replica is not None:
            self._sessions[replica] -= 1
        return replica


class StageReplicas(EntryEngine, StreamEngine):
    """One stage's replicas (engines of the same kind, one per device) as one engine."""

    def __init__(self, name: str, replicas: Sequence[Engine], devices: Sequence[str]) -> None:
        if len(replicas) != len(devices) or not replicas:
            raise ValueError("one device per replica, and at least one replica")
        self.name = name
        self.replicas = list(replicas)
        self.devices = list(devices)
        self.chooser = ReplicaChooser(len(replicas))
        self._serving: dict[str, int] = {}
        """Request id -> the replica serving it (placed, not yet begun included)."""
        self._closed = False

    async def start(self) -> None:
        """Start every replica at once (each loads its model on its own device); if one
        fails, the others are closed and its error is raised."""
        try:
            async with asyncio.TaskGroup() as group:
                for replica in self.replicas:
                    group.create_task(replica.start())
        except BaseExceptionGroup as group_error:
            await self.close()
            first = group_error.exceptions[0]
            raise first from None

    @property
    def batch_size(self) -> int:
        """The largest batch any replica ran last (the stage's batching gauge)."""
        return max(int(getattr(r, "batch_size", 0)) for r in self.replicas)

    def active_requests(self) -> int:
        return sum(replica.active_requests() for replica in self.replicas)

    def capacity(self) -> Capacity | None:
        """The replicas' figures summed (rows, waiting places, memory): each serves its own
        sessions. None when no replica states any."""
        stated = [c for replica in self.replicas if (c := replica.capacity()) is not None]
        if not stated:
            return None
        total = stated[0]
        for more in stated[1:]:
            total = total + more
        return total

    def row_load(self) -> RowLoad | None:
        loads = [load for replica in self.replicas if (load := replica.row_load()) is not None]
        return sum(loads, RowLoad()) if loads else None

    def shared_by_processes(self) -> bool:
        return all(replica.shared_by_processes() for replica in self.replicas)

    def requests_on(self, replica: int) -> int:
        """Requests in flight on one replica (as routed here)."""
        return sum(1 for placed in self._serving.values() if placed == replica)

    def _down(self) -> list[int]:
        return [i for i, r in enumerate(self.replicas) if r.stalled(_DOWN_BOUND_S) is not None]

    def _place(self, request_id: str, session_id: str) -> int:
        if request_id in self._serving:
            raise ValueError(f"request {request_id!r} is already in flight on stage {self.name}")
        busy = [self.requests_on(r) for r in range(len(self.replicas))]
        replica, left = self.chooser.choose(session_id, busy, self._down())
        if left is not None:
            log.warning(
                "stage %s: session %s moves from %s (down) to %s; its kept state there is lost",
                self.name,
                session_id,
                self.devices[left],
                self.devices[replica],
            )
        self._serving[request_id] = replica
        return replica

    async def generate(
        self, request_id: str, work: PipelineRequest | StageInput, /
    ) -> AsyncGenerator[Chunk, None]:
        """Either kind's: the replicas' own kind decides (a worker's engine checks itself
        against its stage's kind when it starts; an engine in this process, here)."""
        request = work.request if isinstance(work, StageInput) else work
        replica = self._place(request_id, request.session_id)
        try:
            stream = _generate(self.replicas[replica], request_id, work)
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await stream.aclose()
        finally:
            del self._serving[request_id]

    async def abort(self, request_id: str) -> None:
        replica = self._serving.get(request_id)
        if replica is not None:
            await self.replicas[replica].abort(request_id)

    async def forget_session(self, session_id: str) -> None:
        replica = self.chooser.forget(session_id)
        if replica is not None:
            await self.replicas[replica].forget_session(session_id)

    def stalled(self, bound_s: float) -> str | None:
        """Down only when no replica can serve: then each one's reason, by device."""
        reasons = [replica.stalled(bound_s) for replica in self.replicas]
        if any(reason is None for reason in reasons):
            return None
        return "; ".join(f"{d}: {reason}" for d, reason in zip(self.devices, reasons, strict=True))

    def broken(self) -> str | None:
        """Any replica broken (one in this process): the process must go, whatever the
        others can still serve."""
        for device, replica in zip(self.devices, self.replicas, strict=True):
            if (reason := replica.broken()) is not None:
                return f"{device}: {reason}"
        return None

    async def close(self) -> None:
        """Close every replica. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(replica.close() for replica in self.replicas))


def _generate(
    engine: Engine, request_id: str, work: PipelineRequest | StageInput
) -> AsyncGenerator[Chunk, None]:
    if isinstance(work, StageInput) and isinstance(engine, StreamEngine):
        return engine.generate(request_id, work)
    if isinstance(work, PipelineRequest) and isinstance(engine, EntryEngine):
        return engine.generate(request_id, work)
    kind = "a StreamEngine" if isinstance(work, StageInput) else "an EntryEngine"
    raise TypeError(f"a replica of this stage must be {kind}, not {type(engine).__name__}")


_DOWN_BOUND_S = 3600.0
"""A replica counts as down for placement only when it says so outright (its link lost, or
stuck past its own `hang_s`, which its `stalled` applies itself): a long bound here keeps a
replica that is merely slow in a step from shedding its sessions."""
