"""`parley serve`: the embedded default in one command.

Order matters. The graph file is checked first, so a configuration error exits 2 with its
message before anything starts. The private redis-server is started next, on the main thread
(its parent-death signal is tied to this thread), then the app runs under uvicorn. The ready
line is printed once the pipeline is loaded, when /readyz turns 200; a pipeline that fails
to start stops the server with exit status 1. SIGINT or SIGTERM stops accepting, closes every
session with a goodbye event (the app's lifespan), stops Redis, and exits 0.

With `--workers N` (N > 1) this process starts Redis the same way and then runs N workers
(workers.py), each a `parley serve --worker-index k` of its own on the shared port; a
worker tells its parent it is ready on a pipe instead of printing the ready line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Generator, Sequence
from types import FrameType

import uvicorn

from pipeline.devices import check_devices, check_workers
from pipeline.gpu_sharing import GpuSharingError
from pipeline.graph_config import GraphConfigError, load_graph
from pipeline.registry import PipelineNotFound, graph_path
from pipeline.remote_stage import serve_remote_stage
from pipeline.tasks import TaskSet
from pipeline.worker_main import EngineBroken, exit_broken
from realtime.transports.webrtc.ice import is_loopback
from realtime.transports.websocket.connection import MAX_MESSAGE_BYTES

from . import event_loop
from .app import Services, create_app
from .redis_server import EmbeddedRedis, RedisServerMissing
from .settings import Settings, SettingsError, parse_settings
from .workers import WorkerPool, listening_socket
from .ws_protocol import ReadAheadWebSocketProtocol

log = logging.getLogger("parley")
GRACEFUL_SHUTDOWN_S = 5
"""OpenAI Realtime's message limit: a bigger WebSocket message closes with 1009."""


class _Server(uvicorn.Server):
    """uvicorn, but a signal ends the process with status 0 after a clean shutdown, and
    a signal while the app starts is told to the app (`on_exit`).

    uvicorn re-raises a captured SIGTERM once it has shut down, which makes the process die
    by that signal; we have already shut down in order, so we exit normally instead. It
    looks at a signal only once the app's startup is over, which for a worker is after its
    pipeline loaded: tens of seconds when a model converts on first use.
    """

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], object]) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:  # a signal handler runs between bytecodes: hand it over
            self._loop.call_soon_threadsafe(self._on_exit)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


POLL_S = 0.05


def freeze_startup_heap() -> None:
    """Take what the server made while starting (modules, the app, the pipeline and its
    models: ~100,000 objects that live as long as the process) out of the garbage
    collector's sight. A full collection otherwise walks all of them each time, stalling
    the event loop: 44-78 ms with 150 streaming sessions a process (13-19 ms frozen), and
    every chunk of every session late by as much."""
    gc.collect()
    gc.freeze()
    log.info(
        "%d objects made while starting frozen out of the collector's walks", gc.get_freeze_count()
    )


class PipelineFailed(Exception):
    """The pipeline could not start: the server can never be ready."""


async def _announce_when_ready(
    server: uvicorn.Server, services: Services, settings: Settings
) -> None:
    """Say where the server listens, then that it is ready once /readyz would say so.

    uvicorn and the pipeline loader expose flags, not events, so both are polled."""
    while not server.started:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    if not services.pipeline_ready and not services.pipeline_error:
        print(
            f"Parley is listening on {settings.base_url}; loading pipeline "
            f"{settings.pipeline!r} (/readyz turns 200 when it is ready)",
            flush=True,
        )
    while not services.pipeline_ready and not services.pipeline_error:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    if services.pipeline_error:
        server.should_exit = True
        raise PipelineFailed(services.pipeline_error)
    freeze_startup_heap()
    print(f"Parley is ready: open {settings.base_url}", flush=True)


async def _report_ready(
    server: uvicorn.Server, services: Services, process_id: str, ready_fd: int
) -> None:
    """A worker's readiness, told to its parent: its process id and a newline on the pipe."""
    while not server.started or not (services.pipeline_ready or services.pipeline_error):  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    if services.pipeline_error:
        server.should_exit = True
        raise PipelineFailed(services.pipeline_error)
    freeze_startup_heap()
    os.write(ready_fd, f"{process_id}\n".encode())
    os.close(ready_fd)


async def _serve(settings: Settings, redis_url: str) -> None:
    app = create_app(settings, redis_url)
    services: Services = app.state.services
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ws_max_size=MAX_MESSAGE_BYTES,
        ws=ReadAheadWebSocketProtocol,
    )
    server = _Server(config, on_exit=services.stopping.set)
    log.info("event loop: %s", event_loop.name(asyncio.get_running_loop()))
    # a TaskSet and not a TaskGroup: the server's end must stop the announcing task rather
    # than wait for it, and its PipelineFailed is read below rather than raised inside an
    # ExceptionGroup
    sockets = None
    try:
        async with TaskSet("announce") as announcing:
            if settings.worker_ready_fd is not None:  # a worker: its own socket on the port
                sockets = [listening_socket(settings.host, settings.port)]
                ready = _report_ready(
                    server, services, app.state.process_id, settings.worker_ready_fd
                )
            else:
                ready = _announce_when_ready(server, services, settings)
            announce = announcing.create_task(ready, log_failure=False)  # read below
            await server.serve(sockets=sockets)
    finally:
        gc.unfreeze()  # what exits frees its objects as usual (native modules check)
    if not announce.cancelled() and isinstance(announce.exception(), PipelineFailed):
        print(f"parley: {announce.exception()}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    if not server.started:
        raise SystemExit(1)


def _check_pipeline(settings: Settings) -> str | None:
    """The graph file's error, if any (a device this host lacks, a GPU stage that --workers
    would load once per server process, included): caught before Redis or models start."""
    try:
        path = graph_path(settings.pipeline)
        config = load_graph(path)
        check_workers(config, str(path), settings.workers, settings.stage_hosts)
        check_devices(config, str(path))
    except (PipelineNotFound, GraphConfigError) as exc:
        return str(exc)
    return None


def serve(settings: Settings, argv: Sequence[str] = ()) -> int:
    """`parley serve`: one process, a worker (--worker-index), or the parent of --workers N
    (`argv`, the command line, is what each worker is started with)."""
    if settings.worker_index is not None:
        return _serve_worker(settings)
    if settings.api_key is None and not is_loopback(settings.host):
        print(
            f"parley: refusing to listen on {settings.host} without an API key: "
            "set --api-key (or PARLEY_API_KEY), or listen on 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    problem = _check_pipeline(settings)
    if problem is not None:
        print(f"parley: --pipeline: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    embedded: EmbeddedRedis | None = None
    redis_url = settings.redis_url
    if redis_url is None:
        embedded = EmbeddedRedis()
        try:
            embedded.start()
        except RedisServerMissing as exc:
            print(f"parley: {exc}", file=sys.stderr)
            return 2
        redis_url = embedded.url
        log.info("embedded redis-server (pid %s) at %s", embedded.pid, redis_url)
    try:
        if settings.workers > 1:
            return WorkerPool(argv, settings, redis_url).run()
        event_loop.run(_serve(settings, redis_url), settings.event_loop)
    except SystemExit as exc:
        return int(exc.code or 0)
    except GpuSharingError as exc:  # the stage hosts' MPS daemon, before any host started
        print(f"parley: {exc}", file=sys.stderr)
        return 2
    finally:
        if embedded is not None:
            embedded.stop()
            log.info("embedded redis-server stopped")
    return 0


def _serve_worker(settings: Settings) -> int:
    """One of the --workers N processes: the parent named the Redis and the port; SIP
    (one UDP port, a dialog must stay in one process) runs in worker 0 only."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker-{settings.worker_index} %(name)s: %(message)s",
    )
    if settings.worker_index != 0:
        settings = dataclasses.replace(settings, sip_port=None)
    assert settings.redis_url is not None
    try:
        event_loop.run(_serve(settings, settings.redis_url), settings.event_loop)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        command, settings = parse_settings(args)
    except SettingsError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return 2
    if command == "serve":
        return serve(settings, args)
    if command == "stage":
        return serve_stage(settings)
    return 2


def serve_stage(settings: Settings) -> int:
    """Serve one stage for a main process elsewhere, until it closes the link or Ctrl-C."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    assert settings.redis_url is not None and settings.stage is not None
    try:
        asyncio.run(serve_remote_stage(settings.pipeline, settings.stage, settings.redis_url))
    except KeyboardInterrupt:
        pass
    except EngineBroken as exc:  # a sticky device error: whoever runs `parley stage` restarts it
        exit_broken(exc)
    except (LookupError, ValueError) as exc:
        print(f"parley: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
