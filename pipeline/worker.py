"""A stage placed in a worker process, seen from the main process as an ordinary Engine.

`WorkerEngine` spawns a child (`worker_main.run_worker`) that runs the real engine, and talks
to it over a shared-memory link, so model compute never runs on the media event loop and
arrays cross with one copy. One reader task routes the child's chunks to per-request
channels. If the child dies, every request it was serving gets an ErrorChunk and a new
child is started (with backoff if it keeps dying).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import socket
from collections.abc import AsyncGenerator
from multiprocessing.process import BaseProcess
from typing import Any

from .channel import Channel, ChannelClosed
from .connectors.base import LinkClosed
from .connectors.shm import DEFAULT_CAPACITY, ShmLink
from .types import Chunk, End, ErrorChunk, PipelineRequest, StageInput
from .worker_main import WorkerSpec, run_worker

log = logging.getLogger("parley.pipeline.worker")

REQUEST_CHANNEL_SIZE = 64
MAX_RESTART_DELAY_S = 10.0


class WorkerFailed(RuntimeError):
    pass


class WorkerEngine:
    def __init__(
        self,
        spec: WorkerSpec,
        start_timeout_s: float = 300.0,
        ring_capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        self.spec = spec
        self.name = spec.stage
        self.start_timeout_s = start_timeout_s
        self.ring_capacity = ring_capacity
        self.restarts = 0
        self._process: BaseProcess | None = None
        self._link: ShmLink | None = None
        self._reader: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._dead = asyncio.Event()
        self._closing = False
        self._requests: dict[str, Channel[Chunk]] = {}
        self._stats: dict[int, asyncio.Future[int]] = {}
        self._tokens = itertools.count()

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the child and wait until its engine is loaded."""
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"worker:{self.name}")

    async def _spawn(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        out, back, rings = ShmLink.create_rings(self.ring_capacity)
        ctx = multiprocessing.get_context("spawn")
        process = ctx.Process(
            target=run_worker,
            args=(self.spec, child_sock, rings),
            name=f"parley-{self.name}",
            daemon=True,
        )
        process.start()
        child_sock.close()
        link = await ShmLink.open(parent_sock, out, back)
        try:
            async with asyncio.timeout(self.start_timeout_s):
                first = await link.recv()
        except (TimeoutError, LinkClosed) as exc:
            await link.close()
            await asyncio.to_thread(_stop_process, process)
            raise WorkerFailed(f"stage {self.name}: the worker did not start ({exc!r})") from None
        if first[0] != "ready":
            await link.close()
            await asyncio.to_thread(_stop_process, process)
            raise WorkerFailed(f"stage {self.name}: {first[1]}")
        self._process, self._link = process, link
        self._dead.clear()
        self._reader = asyncio.create_task(self._read(link), name=f"worker:{self.name}:reader")
        self._ready.set()
        log.info("stage %s: worker pid %s ready", self.name, process.pid)

    async def _supervise(self) -> None:
        """Restart the child whenever it dies, until close()."""
        delay = 0.5
        while True:
            await self._dead.wait()
            if self._closing:
                return
            self.restarts += 1
            while not self._closing:
                try:
                    await self._spawn()
                    delay = 0.5
                    break
                except WorkerFailed as exc:
                    log.error("%s; retrying in %.1f s", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RESTART_DELAY_S)

    async def _read(self, link: ShmLink) -> None:
        try:
            while True:
                message = await link.recv()
                kind = message[0]
                if kind == "chunk":
                    channel = self._requests.get(message[1])
                    if channel is not None:
                        with contextlib.suppress(ChannelClosed):
                            await channel.send(message[2])
                elif kind == "done":
                    if (channel := self._requests.get(message[1])) is not None:
                        channel.close()
                elif kind == "stats":
                    future = self._stats.pop(message[1], None)
                    if future is not None and not future.done():
                        future.set_result(message[2])
        except LinkClosed:
            pass
        finally:
            await self._on_death()

    async def _on_death(self) -> None:
        self._ready.clear()
        if not self._closing:
            pid = self._process.pid if self._process else None
            log.error("stage %s: worker pid %s died; restarting", self.name, pid)
        for rid, channel in list(self._requests.items()):
            failure = ErrorChunk(f"the {self.name} worker stopped while serving {rid}", self.name)
            channel.close_with(failure)
        for future in self._stats.values():
            if not future.done():
                future.set_exception(LinkClosed("worker died"))
        self._stats.clear()
        if self._link is not None:
            link, self._link = self._link, None
            await link.close()
        if self._process is not None:
            process, self._process = self._process, None
            await asyncio.to_thread(_stop_process, process)
        self._dead.set()

    async def close(self) -> None:
        """Stop the child (politely, then by force). Idempotent."""
        self._closing = True
        if self._link is not None:
            with contextlib.suppress(LinkClosed):
                await self._link.send(("close",))
        process = self._process
        if process is not None:
            await asyncio.to_thread(process.join, 3.0)
        for task in (self._reader, self._supervisor):
            if task is not None:
                task.cancel()
                await asyncio.wait({task})
        self._reader = self._supervisor = None
        if self._process is not None:
            await asyncio.to_thread(_stop_process, self._process)
            self._process = None
        if self._link is not None:
            await self._link.close()
            self._link = None

    # --- the engine contract -------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def active_requests(self) -> int:
        return len(self._requests)

    async def remote_active_requests(self) -> int:
        """How many requests the engine inside the child holds (for tests and checks)."""
        link = await self._live_link()
        token = next(self._tokens)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._stats[token] = future
        await link.send(("stats", token))
        return await future

    async def _live_link(self) -> ShmLink:
        async with asyncio.timeout(self.start_timeout_s):
            await self._ready.wait()
        assert self._link is not None
        return self._link

    async def abort(self, request_id: str) -> None:
        channel = self._requests.pop(request_id, None)
        if channel is not None:
            channel.discard()
        if self._link is not None:
            with contextlib.suppress(LinkClosed):
                await self._link.send(("abort", request_id))

    async def generate(self, request_id: str, inputs: Any) -> AsyncGenerator[Chunk, None]:
        try:
            link = await self._live_link()
        except TimeoutError:
            yield ErrorChunk(f"the {self.name} worker is not running", self.name)
            return
        channel: Channel[Chunk] = Channel(REQUEST_CHANNEL_SIZE)
        self._requests[request_id] = channel
        streamed = isinstance(inputs, StageInput)
        request: PipelineRequest = inputs.request if streamed else inputs
        feeder: asyncio.Task[None] | None = None
        finished = False
        try:
            await link.send(("generate", request_id, request, streamed))
            if streamed:
                feeder = asyncio.create_task(self._feed(link, request_id, inputs))
            async for chunk in channel:
                yield chunk
                if isinstance(chunk, End | ErrorChunk):
                    finished = True
                    return
            finished = True
        except LinkClosed:
            finished = True
            yield ErrorChunk(f"the {self.name} worker stopped", self.name)
        finally:
            if feeder is not None:
                feeder.cancel()
                await asyncio.wait({feeder})
            if finished:
                self._requests.pop(request_id, None)
            else:
                await self.abort(request_id)

    async def _feed(self, link: ShmLink, request_id: str, inputs: StageInput) -> None:
        """Forward the upstream chunks of a streamed request to the child."""
        with contextlib.suppress(LinkClosed):
            async for chunk in inputs.chunks:
                await link.send(("input", request_id, chunk))
            await link.send(("input_end", request_id))


def _stop_process(process: BaseProcess) -> None:
    if process.is_alive():
        process.terminate()
        process.join(2.0)
    if process.is_alive():
        process.kill()
        process.join(2.0)
    with contextlib.suppress(ValueError):
        process.close()
