"""A stage placed in a worker process, seen from the main process as an ordinary Engine.

`WorkerEngine` starts a child (`python -m pipeline.worker_main`) that runs the real engine and
talks to it over a shared-memory link, so model compute never runs on the media event loop
and arrays cross with one copy. If the child dies, every request it was serving gets an
ErrorChunk (see `LinkedStage`) and a new child is started, with backoff if it keeps dying.

Children start with OpenMP's waiting threads sleeping (`OMP_WAIT_POLICY=PASSIVE`, unless the
environment says otherwise). By default a thread that finished its share of a parallel op
spins until the next; on a small machine where other processes want the same cores, two-
thread SmolLM2 then took 23 s instead of 1.5 s for an answer (a spinning thread waits on a
descheduled one at every op). With passive waits it degrades to the one-thread speed
instead, and alone it keeps most of the two-thread gain (`loadtest.thinker_bench`).
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
from .link_messages import Close, Fatal, Ready
from .stage_client import LinkedStage
from .tasks import cancel_and_wait
from .worker_main import WorkerSpec, launch_args

log = logging.getLogger("parley.pipeline.worker")

MAX_RESTART_DELAY_S = 10.0


class WorkerFailed(RuntimeError):
    pass


class WorkerEngine(LinkedStage):
    def __init__(
        self,
        spec: WorkerSpec,
        start_timeout_s: float = 300.0,
        ring_capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        super().__init__(spec.stage, start_timeout_s)
        self.spec = spec
        self.ring_capacity = ring_capacity
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._dead = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self) -> None:
        """Spawn the child and wait until its engine is loaded."""
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"worker:{self.name}")

    async def _spawn(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        out, back, rings = ShmLink.create_rings(self.ring_capacity)
        fd = child_sock.fileno()
        # fork+exec takes milliseconds, and only when a worker (re)starts
        env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}
        process = subprocess.Popen(  # noqa: ASYNC220
            launch_args(self.spec, fd, rings), pass_fds=(fd,), env=env
        )
        child_sock.close()
        link = await ShmLink.open(parent_sock, out, back)
        try:
            async with asyncio.timeout(self.start_timeout_s):
                first = await link.recv()
        except (TimeoutError, LinkClosed) as exc:
            first = Fatal(f"the worker did not start ({exc!r})")
        match first:
            case Ready():
                problem = None
            case Fatal(message):
                problem = message
            case _:
                problem = f"the worker said {first!r} before it was ready"
        if problem is not None:
            await link.close()
            await asyncio.to_thread(_stop_process, process)
            raise WorkerFailed(f"stage {self.name}: {problem}")
        self._process = process
        self._dead.clear()
        self._attach(link)
        log.info("stage %s: worker pid %s ready", self.name, process.pid)

    async def _on_lost(self) -> None:
        log.error("stage %s: worker pid %s died; restarting", self.name, self.pid)
        if self._process is not None:
            process, self._process = self._process, None
            await asyncio.to_thread(_stop_process, process)
        self._dead.set()

    async def _supervise(self) -> None:
        """Restart the child whenever it dies, until close()."""
        delay = 0.5
        while True:
            await self._dead.wait()
            self.restarts += 1
            while True:
                try:
                    await self._spawn()
                    delay = 0.5
                    break
                except WorkerFailed as exc:
                    log.error("%s; retrying in %.1f s", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RESTART_DELAY_S)

    async def close(self) -> None:
        """Stop the child (politely, then by force). Idempotent."""
        self._closing = True
        supervisor, self._supervisor = self._supervisor, None
        await cancel_and_wait(supervisor)
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


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(2.0)
    if process.poll() is None:
        process.kill()
        process.wait(2.0)
