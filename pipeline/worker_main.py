"""The serving side of a stage: one engine served over a link, in its own process.

A worker is spawned by the main process with a socket and the names of two shared-memory
rings; a remote stage (`parley stage`) reaches the main process through Redis streams. Either
way `serve_stage` builds the engine, checks that it is the kind the graph makes of the stage
(an EntryEngine for an entry stage, a StreamEngine otherwise; if not it says `Fatal` and
stops before loading anything), says `Ready`, then serves requests concurrently: each
`Generate` becomes a task streaming chunks back; `Abort` cancels that task (the engine aborts
on cancellation); the end of the link (the parent closed it or died) ends the serving.

The messages are the dataclasses of `link_messages.py` (`ToStage` in, `FromStage` out),
dispatched with `match`. Every `heartbeat_s` (`BEAT_S` for a worker or a stage host) the
server says `Alive` while its engine makes progress (`Engine.stalled(spec.hang_s)` is None),
or `Stuck` with the engine's reason: a heartbeat from the event loop alone would vouch for
an engine whose model thread is stuck. A process stopped outright says nothing, which the
main process notices after `hang_s` (`stage_client`).

The same pieces (`start_engine`, `StageServer`) serve a stage host's links too
(`stage_host.py`: one engine, one `StageServer` per server process that dials it).

An engine that breaks (`Engine.broken`: a sticky device error, after which its CUDA context
can run nothing) ends the serving: the heartbeat says `Stuck` with the reason, so the main
process fails the requests in flight and marks the stage down at once, and the serving
raises `EngineBroken`; the process then exits with `BROKEN_EXIT` without closing the engine
(`exit_broken`: freeing memory of a failed context can hang), and its supervisor starts a
fresh one (a worker's `WorkerEngine`, a stage host's parent, `parley stage`'s own).

A remote stage also rides out its link's outages (Redis down or restarting): the requests in
flight are dropped (the main process has failed them already), and once the link works
again the stage says `Ready` again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
from collections.abc import AsyncGenerator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NoReturn

from .channel import Channel, ChannelClosed
from .connectors.base import Link, LinkClosed, LinkUnavailable
from .connectors.shm import RingSpec, ShmLink
from .device_faults import exit_now
from .engines.registry import create_engine
from .gpu_usage import GpuUsageWatch
from .graph_config import DEFAULT_HANG_S, StageKind, wrong_engine_kind
from .link_messages import (
    Abort,
    Alive,
    ChunkMessage,
    Close,
    Done,
    DropTurn,
    Fatal,
    FeedTurn,
    ForgetSession,
    Generate,
    Input,
    InputEnd,
    OpenTurn,
    Ready,
    Stats,
    StatsReply,
    Stuck,
)
from .tasks import TaskSet, background, cancel_and_wait
from .types import (
    Chunk,
    End,
    Engine,
    EntryEngine,
    ErrorChunk,
    PipelineRequest,
    StageInput,
    StreamEngine,
    StreamingInput,
    streams_input,
)

log = logging.getLogger("parley.pipeline.worker")

INPUT_CHANNEL_SIZE = 256
RETRY_MIN_S = 0.25
RETRY_MAX_S = 5.0
BEAT_S = 0.5
"""How often a worker or a stage host says it is alive: a tenth of the default hang bound."""
BROKEN_EXIT = 3
"""The exit status of a stage process whose engine broke (`EngineBroken`)."""


class EngineBroken(RuntimeError):
    """The engine served here broke for good (`Engine.broken`); its process must exit."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(f"stage {stage}: {reason}")
        self.stage = stage
        self.reason = reason


def exit_broken(error: EngineBroken) -> NoReturn:
    """End this stage process at once with `BROKEN_EXIT`, saying why. No clean-up runs: the
    engine's device context has failed, and freeing its memory or torch's exit hooks could
    hang on it; the link was closed already and the supervisor starts a fresh process."""
    log.critical("%s; exiting with status %d so that a fresh process serves it", error, BROKEN_EXIT)
    exit_now(BROKEN_EXIT)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    stage: str
    engine: str
    kind: StageKind
    """What the graph makes of the stage; the engine built is checked against it."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    hang_s: float = DEFAULT_HANG_S
    """No progress for this long: the stage is hung (`StageConfig.hang_s`)."""


def run_worker(spec: WorkerSpec, sock: socket.socket, rings: RingSpec) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker[{spec.stage}] %(message)s")
    try:
        asyncio.run(_serve(spec, sock, rings))
    except EngineBroken as exc:
        exit_broken(exc)


def launch_args(spec: WorkerSpec, fd: int, rings: RingSpec) -> list[str]:
    """The command line that starts a worker on inherited socket `fd`.

    Workers are plain `python -m pipeline.worker_main` processes rather than multiprocessing
    children: a spawned multiprocessing child re-imports the parent's `__main__`, which runs
    whatever a launcher script does at import time a second time.
    """
    body = {"spec": asdict(spec), "fd": fd, "rings": rings.to_dict()}
    return [sys.executable, "-m", "pipeline.worker_main", json.dumps(body)]


def main(argv: list[str]) -> None:
    ignore_terminal_interrupt()
    body = json.loads(argv[1])
    sock = socket.socket(fileno=body["fd"])
    run_worker(WorkerSpec(**body["spec"]), sock, RingSpec.from_dict(body["rings"]))


async def _serve(spec: WorkerSpec, sock: socket.socket, rings: RingSpec) -> None:
    await serve_stage(spec, await ShmLink.attach(sock, rings))


async def serve_stage(
    spec: WorkerSpec, link: Link, heartbeat_s: float = BEAT_S, ride_outages: bool = False
) -> None:
    """Build the engine and serve it over `link` until the link ends or says close, saying
    `Alive` (or `Stuck`) every `heartbeat_s`. `ride_outages` (a remote stage): a link that
    is unavailable for a while is waited for instead of ending the serving. Raises
    EngineBroken, with the engine left as it is, if the engine broke (see `exit_broken`)."""
    try:
        engine = await start_engine(spec)
    except StageStartError as exc:
        await _fail(link, str(exc))
        return
    server = StageServer(spec.stage, engine, link, hang_s=spec.hang_s, heartbeat_s=heartbeat_s)
    broken = False
    try:
        await _serve_until_closed(server, link, ride_outages)
    except EngineBroken:
        broken = True
        raise
    finally:
        await server.stop()
        if not broken:
            await engine.close()
        await link.close()


def ignore_terminal_interrupt() -> None:
    """A Ctrl-C at a terminal reaches every process of its group: the server and its workers
    at once. A worker that ended on it was seen by its parent as a crash ("ended with status
    ...; restarting") a moment before the parent's own orderly stop. The parent owns the
    stop: it closes its workers, and a worker whose parent is gone ends with its link."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class StageStartError(RuntimeError):
    """The stage's engine could not be built or started; the message says why."""


async def start_engine(spec: WorkerSpec) -> Engine:
    """Build the stage's engine, check it is the kind the graph makes of the stage (before
    loading anything), and start it."""
    try:
        engine = create_engine(spec.engine, spec.engine_args)
        if not _fits(spec.kind, engine):
            message = wrong_engine_kind(spec.stage, spec.kind, engine)
            log.error("%s", message)
            raise StageStartError(message)
        await engine.start()
    except StageStartError:
        raise
    except Exception as exc:
        log.exception("engine %s failed to start", spec.engine)
        raise StageStartError(f"{type(exc).__name__}: {exc}") from exc
    return engine


def ready_message(engine: Engine) -> Ready:
    """What the serving side says once its engine serves: its capacity, and whether it
    takes turns streamed while the user speaks."""
    return Ready(engine.capacity(), streams_input(engine))


def _fits(kind: StageKind, engine: Engine) -> bool:
    return isinstance(engine, EntryEngine if kind == "entry" else StreamEngine)


async def _fail(link: Link, message: str) -> None:
    with contextlib.suppress(LinkClosed):
        await link.send(Fatal(message))
    await link.close()


async def _serve_until_closed(server: StageServer, link: Link, ride_outages: bool) -> None:
    retry_s = RETRY_MIN_S
    while True:
        try:
            await link.send(ready_message(server.engine))
            if retry_s > RETRY_MIN_S:
                log.info("the link works again; serving")
                retry_s = RETRY_MIN_S
            await server.serve()
            return
        except LinkClosed:
            return
        except LinkUnavailable as exc:
            if not ride_outages:
                raise
            if retry_s == RETRY_MIN_S:
                log.warning("the link is unavailable (%s); dropping requests in flight", exc)
            await server.stop()
            await asyncio.sleep(retry_s)
            retry_s = min(retry_s * 2, RETRY_MAX_S)


class StageServer:
    """One link's requests to an engine, and its heartbeat. `engine_prefix` goes before
    every request id the engine sees: a stage host serves one engine to several links,
    whose ids may meet."""

    def __init__(
        self,
        stage: str,
        engine: Engine,
        link: Link,
        engine_prefix: str = "",
        *,
        hang_s: float = DEFAULT_HANG_S,
        heartbeat_s: float = BEAT_S,
    ) -> None:
        self.stage = stage
        self.engine = engine
        self.link = link
        self.engine_prefix = engine_prefix
        self.hang_s = hang_s
        self.heartbeat_s = heartbeat_s
        self._requests = TaskSet(f"stage:{stage}:requests")
        """Owns the requests in flight; `stop()` closes it."""
        self.tasks: dict[str, asyncio.Task[None]] = {}
        """The same tasks by request id (for `Abort`)."""
        self.inputs: dict[str, Channel[Chunk]] = {}
        self.broken: str | None = None
        """Why the engine broke, once the heartbeat found it so (`Engine.broken`)."""
        self._gpu = GpuUsageWatch()
        """This process's GPU memory, sent with each `Alive`."""

    async def serve(self) -> None:
        """Serve the link's requests until it ends or says close, beating meanwhile. Raises
        EngineBroken once the engine broke (the link was told `Stuck` first)."""
        # a task and not a TaskGroup: the heartbeat never ends by itself, and a TaskGroup
        # would hand the link's LinkUnavailable to the caller inside an ExceptionGroup
        serving = asyncio.current_task()
        assert serving is not None
        beat = background(self._heartbeat(serving), name=f"stage:{self.stage}:heartbeat")
        try:
            await self._serve()
        except asyncio.CancelledError:
            if self.broken is None or serving.uncancel() > 0:
                raise  # cancelled by its owner (too)
            raise EngineBroken(self.stage, self.broken) from None
        finally:
            await cancel_and_wait(beat)

    async def _heartbeat(self, serving: asyncio.Task[Any]) -> None:
        """`Alive` while the engine makes progress, `Stuck` while it does not; once the
        engine broke, `Stuck` with why (if the link still takes it), then the serving ends
        (`serving` is cancelled, and raises EngineBroken)."""
        said: str | None = None
        with contextlib.suppress(LinkClosed, LinkUnavailable):  # serve() sees the same
            while True:
                await asyncio.sleep(self.heartbeat_s)
                if (broken := self.engine.broken()) is not None:
                    self.broken = broken
                    break
                reason = self.engine.stalled(self.hang_s)
                if reason != said and reason is not None:
                    log.error("stage %s is stuck: %s", self.stage, reason)
                said = reason
                engine = self.engine
                streamed = engine.streamed_turns() if isinstance(engine, StreamingInput) else None
                await self.link.send(
                    Alive(engine.capacity(), engine.row_load(), streamed, self._gpu.read())
                    if reason is None
                    else Stuck(reason)
                )
            log.critical("stage %s is broken: %s", self.stage, broken)
            await self.link.send(Stuck(broken, broken=True))
        if self.broken is not None:
            serving.cancel()

    async def _serve(self) -> None:
        while True:
            match await self.link.recv():
                case Generate(rid, request, streamed):
                    stream = self._open(rid, request, streamed)
                    self.tasks[rid] = self._requests.create_task(self._run(rid, stream), name=rid)
                case Input(rid, chunk):
                    if (target := self.inputs.get(rid)) is not None:
                        with contextlib.suppress(ChannelClosed):
                            await target.send(chunk)
                case InputEnd(rid):
                    if (ended := self.inputs.get(rid)) is not None:
                        ended.close()
                case Abort(rid):
                    await self._abort(rid)
                case ForgetSession(session_id):
                    await self.engine.forget_session(session_id)
                case OpenTurn() | FeedTurn() | DropTurn() as call:
                    await self._streamed(call)
                case Stats(token):
                    await self.link.send(StatsReply(token, self.engine.active_requests()))
                case Close():
                    return
                case other:
                    log.warning("ignoring %r: not a message to a stage", other)

    async def _streamed(self, call: OpenTurn | FeedTurn | DropTurn) -> None:
        """A call of a turn streamed while the user speaks, passed on to an engine that
        takes them (the turn's id prefixed as a request's is); any other ignores it, and
        the turn's request, naming a turn it never had, is taken whole."""
        engine = self.engine
        if not isinstance(engine, StreamingInput):
            return
        turn_id = self.engine_prefix + call.turn_id
        match call:
            case OpenTurn(_, context):
                await engine.open_turn(turn_id, context)
            case FeedTurn(_, pcm):
                await engine.feed_turn(turn_id, pcm)
            case DropTurn():
                await engine.drop_turn(turn_id)

    def _open(
        self, rid: str, request: PipelineRequest, streamed: bool
    ) -> AsyncGenerator[Chunk, None]:
        """The engine's stream for a request, fed by an input channel for a stream stage."""
        if request.streamed_turn and self.engine_prefix:  # the turn as `_streamed` named it
            request = replace(request, streamed_turn=self.engine_prefix + request.streamed_turn)
        match self.engine:
            case StreamEngine() if streamed:
                channel: Channel[Chunk] = Channel(INPUT_CHANNEL_SIZE)
                self.inputs[rid] = channel
                return self.engine.generate(
                    self.engine_prefix + rid, StageInput(request, aiter(channel))
                )
            case EntryEngine() if not streamed:
                return self.engine.generate(self.engine_prefix + rid, request)
        served = "upstream chunks" if streamed else "no upstream"
        return _refuse(
            f"{self.stage} is served here as {'an entry' if streamed else 'a stream'} stage, "
            f"but {rid} came with {served}: do both sides use the same graph file?"
        )

    async def _run(self, rid: str, opened: AsyncGenerator[Chunk, None]) -> None:
        try:
            async with contextlib.aclosing(opened) as stream:
                async for chunk in stream:
                    await self.link.send(ChunkMessage(rid, chunk))
                    if isinstance(chunk, End | ErrorChunk):
                        break
        except (LinkClosed, LinkUnavailable):
            return
        except Exception as exc:
            log.exception("request %s failed", rid)
            with contextlib.suppress(LinkClosed, LinkUnavailable):
                await self.link.send(ChunkMessage(rid, ErrorChunk(f"{type(exc).__name__}: {exc}")))
        finally:
            self.tasks.pop(rid, None)
            if (feed := self.inputs.pop(rid, None)) is not None:
                feed.discard()
        with contextlib.suppress(LinkClosed, LinkUnavailable):
            await self.link.send(Done(rid))

    async def _abort(self, rid: str) -> None:
        await cancel_and_wait(self.tasks.get(rid))
        await self.engine.abort(self.engine_prefix + rid)

    async def stop(self) -> None:
        """Cancel every request in flight and wait until each has ended. The server may
        serve again after (a link back from an outage), with a fresh owner."""
        requests, self._requests = self._requests, TaskSet(f"stage:{self.stage}:requests")
        await requests.close()


async def _refuse(message: str) -> AsyncGenerator[Chunk, None]:
    yield ErrorChunk(message)


if __name__ == "__main__":
    main(sys.argv)
