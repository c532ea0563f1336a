"""Under MPS, the stage processes of one daemon are restarted together, under a fresh daemon.

With `gpu_sharing: mps` (gpu_sharing.py) every stage process is a client of one MPS server.
A fatal error in one client (a sticky CUDA error, or a client killed in the middle of its
work) reaches every client of that server: their calls fail too, and the daemon takes no new
client until all of them have exited. Restarting only the stage that died would leave it
waiting for a daemon that will never take it, and the others failing. So when one member's
process ends (`WorkerEngine._on_lost`: it died, broke, or was killed as hung), the group
stops every other member's process (their requests fail with `model_error`, as a death's
do), quits the daemon, starts a fresh one, and only then do the members start again, each
through its own supervisor as after any death. A member whose process ends during or after
that restart for the same cause finds the group's epoch moved on and just starts again.

The same for the stage hosts of `parley serve --workers N`: `web/workers.py` restarts every
host together under a fresh daemon. An operator's own daemon (CUDA_MPS_PIPE_DIRECTORY set
before the start) is not ours to quit: there a stage restarts alone, as without MPS.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from .gpu_sharing import GpuSharingError, MpsDaemon

log = logging.getLogger("parley.pipeline.gpu_sharing")


class MpsMember(Protocol):
    """A stage whose process is a client of the group's daemon (a `WorkerEngine`)."""

    name: str

    async def stop_for_daemon(self, reason: str) -> None:
        """End its process now (its requests fail with `reason`); its supervisor starts it
        again once the group's restart is over."""
        ...


class MpsStages:
    """The stage processes started under one MPS daemon (`daemon`), restarted together."""

    def __init__(self, daemon: MpsDaemon) -> None:
        self.daemon = daemon
        self.members: list[MpsMember] = []
        self.epoch = 0
        """How many times the daemon was restarted: a member notes it when its process starts."""
        self._lock = asyncio.Lock()

    def add(self, member: MpsMember) -> None:
        self.members.append(member)

    async def member_lost(self, member: MpsMember, started_epoch: int) -> None:
        """`member`'s process (started at `started_epoch`) has ended: unless the daemon was
        restarted since, stop every other member and restart the daemon. Returns once the
        member may start again (the caller's supervisor starts it)."""
        async with self._lock:
            if started_epoch != self.epoch or not self.daemon.owned:
                return
            others = [other for other in self.members if other is not member]
            log.error(
                "stage %s ended under MPS: its daemon takes no new client while the others "
                "run; restarting %s with a fresh MPS daemon",
                member.name,
                "it" if not others else f"it and {', '.join(o.name for o in others)}",
            )
            reason = f"its MPS daemon is restarting after stage {member.name} ended"
            await asyncio.gather(*(other.stop_for_daemon(reason) for other in others))
            try:
                await asyncio.to_thread(self.daemon.restart)
            except GpuSharingError as exc:  # they start again without MPS: slower, but up
                log.error("%s; the stages start again without it", exc)
            self.epoch += 1
