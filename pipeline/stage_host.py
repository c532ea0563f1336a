"""One stage's engine, loaded once and served to every server process of a host.

With `parley serve --workers N`, each server process builds its own pipeline. A stage the
graph places in a worker process would then be loaded N times (N times the model's memory,
N batchers that never batch together). Instead, the parent starts one stage host per such
stage (`python -m pipeline.stage_host`), and each server process dials it
(`SharedStageEngine`): one shared-memory link per server process, all feeding one engine,
so requests from every process batch together and a session's kept state (the Thinker's
KV) is found whichever process serves the session next.

The host starts its engine before it listens, then says ready on the fd its parent gave it,
and from then on beats there (a byte every `BEAT_S`) while its engine makes progress: the
parent kills a host that has been silent for the stage's `hang_s` (stopped, its loop
blocked, or its engine stuck in a step) and starts it again, as it does one that died.
Each connection is served as a worker's link is (`StageServer`), with request ids prefixed
by the connection's number, since two processes may use the same id. A connection that ends
(its server process stopped or died) ends its requests; the others go on. SIGTERM, or the
parent's death (PR_SET_PDEATHSIG, set by the parent), stops the host: every connection is
closed, then the engine. An engine that breaks (`Engine.broken`: a sticky device error) ends
the host too: each connection is told `Stuck` with why, then the host exits with
`BROKEN_EXIT` (its engine not closed, `worker_main.exit_broken`) and its parent starts it
again as it does one that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import asdict

from .connectors.base import LinkClosed
from .connectors.shm_dial import BadHello, answer
from .tasks import TaskSet, background, cancel_all
from .types import Engine
from .worker_main import (
    BEAT_S,
    EngineBroken,
    StageServer,
    StageStartError,
    WorkerSpec,
    exit_broken,
    ignore_terminal_interrupt,
    ready_message,
    start_engine,
)

log = logging.getLogger("parley.pipeline.stage_host")

MAX_CONNECTIONS = 256
"""Server processes a host serves at once; past this a connection is closed at once."""
HELLO_TIMEOUT_S = 5.0


def launch_args(spec: WorkerSpec, path: str, ready_fd: int, log_level: str = "info") -> list[str]:
    """The command line of a host serving `spec` on the unix socket `path`."""
    body = {"spec": asdict(spec), "path": path, "ready_fd": ready_fd, "log_level": log_level}
    return [sys.executable, "-m", "pipeline.stage_host", json.dumps(body)]


def main(argv: list[str]) -> None:
    ignore_terminal_interrupt()
    body = json.loads(argv[1])
    spec = WorkerSpec(**body["spec"])
    logging.basicConfig(
        level=str(body.get("log_level", "info")).upper(),
        format=f"%(asctime)s %(levelname)s stage-host[{spec.stage}] %(name)s: %(message)s",
    )
    try:
        asyncio.run(host_stage(spec, body["path"], body["ready_fd"]))
    except StageStartError as exc:
        print(f"stage {spec.stage}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except EngineBroken as exc:
        exit_broken(exc)


async def host_stage(spec: WorkerSpec, path: str, ready_fd: int | None) -> None:
    """Start the engine, listen on `path`, say ready, serve until SIGTERM. Raises
    EngineBroken, the engine left as it is, once the engine broke."""
    engine = await start_engine(spec)
    stop = asyncio.Event()
    broken: list[str] = []
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        with _listening(path) as listener:
            tasks: list[asyncio.Task[None]] = []
            if ready_fd is not None:
                os.write(ready_fd, b"ready\n")
                os.set_blocking(ready_fd, False)
                beat = _beat(ready_fd, spec.stage, engine, spec.hang_s)
                tasks.append(background(beat, "stage-host:beat"))
            log.info("stage %s: serving on %s", spec.stage, path)
            host = _Host(spec.stage, engine, spec.hang_s)
            tasks.append(background(host.accept(listener), "stage-host:accept"))
            tasks.append(background(_until_broken(engine, broken, stop), "stage-host:broken"))
            try:
                await stop.wait()
            finally:
                await cancel_all(tasks)
                await host.close()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if not broken:
            await engine.close()
    if broken:
        raise EngineBroken(spec.stage, broken[0])


async def _until_broken(engine: Engine, broken: list[str], stop: asyncio.Event) -> None:
    """Once the engine broke: put why in `broken` and, a heartbeat later (each connection's
    `StageServer` says `Stuck` to its server process meanwhile), set `stop`."""
    while True:  # polled as the heartbeat is: nothing tells the loop of a thread's error
        if (reason := engine.broken()) is not None:
            break
        await asyncio.sleep(BEAT_S)
    broken.append(reason)
    await asyncio.sleep(2 * BEAT_S)
    stop.set()


async def _beat(fd: int, stage: str, engine: Engine, hang_s: float) -> None:
    """Tell the parent the host lives and its engine makes progress: a byte every BEAT_S
    on the ready pipe, none while the engine is stuck. Owns `fd` (closed at the end). A
    parent that stopped reading (gone, or a test that only waited for ready) ends it."""
    stuck: str | None = None
    try:
        while True:
            await asyncio.sleep(BEAT_S)
            reason = engine.stalled(hang_s)
            if reason is not None:
                if reason != stuck:
                    log.error("stage %s is stuck: %s; no heartbeat to the parent", stage, reason)
                stuck = reason
                continue
            stuck = None
            with contextlib.suppress(BlockingIOError):  # a full pipe: the parent is behind
                os.write(fd, b".")
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _listening(path: str) -> Iterator[socket.socket]:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by a host that was killed
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        listener.setblocking(False)
        yield listener
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class _Host:
    """The connections of one host: each served by a task this owns."""

    def __init__(self, stage: str, engine: Engine, hang_s: float) -> None:
        self.stage = stage
        self.engine = engine
        self.hang_s = hang_s
        self.connections = TaskSet(f"stage-host:{stage}")
        self._count = 0

    async def accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            if len(self.connections) >= MAX_CONNECTIONS:
                log.warning(
                    "stage %s: %d connections already; refusing one", self.stage, MAX_CONNECTIONS
                )
                sock.close()
                continue
            self._count += 1
            self.connections.create_task(
                self._serve(sock, self._count), name=f"stage-host:c{self._count}"
            )

    async def _serve(self, sock: socket.socket, number: int) -> None:
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                link = await answer(sock)
        except (BadHello, OSError, TimeoutError) as exc:
            log.warning("stage %s: connection %d dropped: %s", self.stage, number, exc)
            sock.close()
            return
        server = StageServer(
            self.stage, self.engine, link, engine_prefix=f"c{number}/", hang_s=self.hang_s
        )
        log.info("stage %s: connection %d opened", self.stage, number)
        try:
            await link.send(ready_message(self.engine))
            await server.serve()
        except LinkClosed:
            pass
        except EngineBroken as exc:
            log.error("stage %s: connection %d ends: %s", self.stage, number, exc.reason)
        except Exception:
            log.exception("stage %s: connection %d failed", self.stage, number)
        finally:
            await server.stop()
            await link.close()
            log.info("stage %s: connection %d closed", self.stage, number)

    async def close(self) -> None:
        """End every connection (their requests first); idempotent."""
        await self.connections.close()


if __name__ == "__main__":
    main(sys.argv)
