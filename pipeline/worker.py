"""A stage placed in a worker process, seen from the main process as an ordinary Engine.

`WorkerEngine` starts a child (`python -m pipeline.worker_main`) that runs the real engine and
talks to it over a shared-memory link, so model compute never runs on the media event loop
and arrays cross with one copy. If the child dies, every request it was serving gets an
ErrorChunk (see `LinkedStage`) and a new child is started, with backoff if it keeps dying.
A child that hangs (no heartbeat for the stage's `hang_s`, or its engine stuck in a step)
has its requests failed with that reason at once, and is killed with SIGKILL: from there it
is a child that died.

Children start with OpenMP's waiting threads sleeping (`OMP_WAIT_POLICY=PASSIVE`, unless the
environment says otherwise). By default a thread that finished its share of a parallel op
spins until the next; on a small machine where other processes want the same cores, two-
thread SmolLM2 then took 23 s instead of 1.5 s for an answer (a spinning thread waits on a
descheduled one at every op). With passive waits it degrades to the one-thread speed
instead, and alone it keeps most of the two-thread gain (`loadtest.thinker_bench`).

Under `gpu_sharing: mps` the graph's workers are one `MpsStages` group (`mps`): a worker
that ends takes the others down with it and they all start again under a fresh daemon
(mps_restart.py says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess

from .connectors.base import LinkClosed
from .connectors.shm import DEFAULT_CAPACITY, ShmLink
from .link_messages import Close
from .mps_restart import MpsStages
from .reconnecting_stage import ReconnectingStage, StageLinkFailed
from .worker_main import BROKEN_EXIT, WorkerSpec, launch_args

log = logging.getLogger("parley.pipeline.worker")


def stage_environment() -> dict[str, str]:
    """The environment of a process that runs a stage's model (a worker, a stage host):
    OpenMP's waiting threads sleep, unless this environment says otherwise."""
    return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}


BROKEN_GRACE_S = 5.0
"""How long a worker that said its engine broke is given to exit by itself (BROKEN_EXIT)."""


class WorkerFailed(StageLinkFailed):
    pass


class WorkerEngine(ReconnectingStage):
    def __init__(
        self,
        spec: WorkerSpec,
        start_timeout_s: float = 300.0,
        ring_capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        super().__init__(spec.stage, start_timeout_s, liveness_s=spec.hang_s)
        self.spec = spec
        self.ring_capacity = ring_capacity
        self._process: subprocess.Popen[bytes] | None = None
        self.last_exit: int | None = None
        """The exit status of the last worker that ended (negative: the signal's number)."""
        self.mps: MpsStages | None = None
        """The group of the MPS daemon this worker is a client of, if it restarts with it."""
        self._mps_epoch = 0
        """The group's epoch when the running worker started."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def _establish(self) -> None:
        """Spawn the child and wait until its engine is loaded. On any failure, also a
        cancellation while the child loads (the server stopped while starting), the child
        is stopped and the link's socket and rings are released."""
        parent_sock, child_sock = socket.socketpair()
        out, back, rings = ShmLink.create_rings(self.ring_capacity)
        process: subprocess.Popen[bytes] | None = None
        link: ShmLink | None = None
        try:
            with child_sock:
                fd = child_sock.fileno()
                # fork+exec takes milliseconds, and only when a worker (re)starts
                process = subprocess.Popen(  # noqa: ASYNC220
                    launch_args(self.spec, fd, rings), pass_fds=(fd,), env=stage_environment()
                )
            link = await ShmLink.open(parent_sock, out, back)
            await self._first_word(link)
        except BaseException as exc:
            if link is not None:
                await link.close()
            else:
                parent_sock.close()
                out.close()
                back.close()
            if process is not None:
                await asyncio.to_thread(_stop_process, process)
            if isinstance(exc, StageLinkFailed):
                raise WorkerFailed(str(exc)) from None
            raise
        self._process = process
        if self.mps is not None:
            self._mps_epoch = self.mps.epoch
        self._attach(link)
        log.info("stage %s: worker pid %s ready", self.name, process.pid)

    lost_reason = "its worker stopped; a new one is starting"

    def _on_hung(self, reason: str) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            log.error("stage %s: worker pid %s is %s; killing it", self.name, process.pid, reason)
            process.kill()  # SIGKILL ends a stopped process too; the link then closes
            self.down_reason = f"{reason}; its worker was killed and a new one is starting"

    async def _on_lost(self) -> None:
        if self._process is not None:
            process, self._process = self._process, None
            # a worker whose engine broke exits by itself (status 3) right after its link
            # closes: give it that moment before stopping it (on a busy machine it was seen
            # still unwinding when the link closed, and was terminated instead)
            grace = BROKEN_GRACE_S if self._broken else 0.0
            await asyncio.to_thread(_stop_process, process, grace)
            self.last_exit = process.returncode
            why = " (its engine broke)" if process.returncode == BROKEN_EXIT else ""
            log.error(
                "stage %s: worker pid %s ended with status %s%s; restarting",
                self.name,
                process.pid,
                process.returncode,
                why,
            )
        if self.mps is not None:  # the others stop and the daemon is fresh before it starts
            await self.mps.member_lost(self, self._mps_epoch)
        await super()._on_lost()

    async def stop_for_daemon(self, reason: str) -> None:
        """End the worker for a restart of its MPS daemon (`MpsStages`): its requests fail
        with `reason` now; losing the link then restarts it, as after a death."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        self._mark_down(reason)
        self.down_reason = f"{reason}; a new worker is starting"
        log.error("stage %s: stopping worker pid %s: %s", self.name, process.pid, reason)
        process.kill()
        await asyncio.to_thread(process.wait, 5.0)

    async def close(self) -> None:
        """Stop the child (politely, then by force). Idempotent."""
        await self._stop_supervisor()
        if self._link is not None:
            with contextlib.suppress(LinkClosed):
                await self._link.send(Close())
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self._process.wait, 3.0)
        await self._detach()
        if self._process is not None:
            await asyncio.to_thread(_stop_process, self._process)
            self._process = None


def _stop_process(process: subprocess.Popen[bytes], grace_s: float = 0.0) -> None:
    """Stop `process`: after `grace_s` for it to end by itself, SIGTERM, then SIGKILL."""
    if grace_s > 0 and process.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(2.0)
    if process.poll() is None:
        process.kill()
        process.wait(2.0)
