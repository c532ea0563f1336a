"""The main-process side of a stage served elsewhere (a worker process or another host).

`LinkedStage` is an engine of either kind, an entry stage's or a stream stage's (the engine
on the other side checks itself against the stage's kind when it starts). It forwards each
request over a link (the messages of `link_messages.py`) and routes what comes back: one
reader task owns the link's inbound side and hands chunks to per-request bounded channels.
When the link is lost, every request in flight gets an ErrorChunk at once, and the subclass
decides what happens next (a worker is restarted; a remote stage is waited for). Subclasses
provide `start`, `close` and call `_attach` / react in `_on_lost`.

On the link a request goes by a key of its own, its id and a count (`resp_1#7`; the engine
over there sees that key as the request's id), never by the bare id: a caller may use an id
again once its request has ended (the omni bench does, from one concurrency level to the
next), and the serving side's `Done`, or any chunk, for the last use can still be on its way
then. Keyed by the bare id, that late `Done` closed the new request's stream: it ended with
no End and no output, which a graph takes as finished.

Hangs. The serving side says `Alive` every heartbeat while its engine makes progress, and
`Stuck` (with why) while its model thread is stuck in a step. With `liveness_s` set, a stage
silent that long (a stopped process, a blocked loop, or over Redis a stage gone), one that
says `Stuck`, or one whose link's transport is down, is marked down: its requests in flight
fail at once with the stage and the reason, new ones fail fast instead of waiting for a
deadline, `stalled` (hence `/readyz`) names it, and `_on_hung` lets a subclass that owns
the process kill it (then it is restarted like one that died). A link lost keeps the stage
down until a new one is attached; a stage that speaks again (`Alive`, or `Ready` after
riding out an outage) is up.

Streamed turns. An engine over there that takes turns streamed while the user speaks says
so in its `Ready` (and its heartbeat carries how its turns ended, for the metrics): then
`open_turn`, `feed_turn` and `drop_turn` go over the link like `forget_session`, on the
same link as the turn's request and before it. A call is sent or let go, never waited on
past the send: with no link (the stage down, or restarting) it is dropped, and the turn's
request, naming a turn the engine never had, is answered whole and counted `missing` there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator

import numpy as np
import numpy.typing as npt

from .capacity import Capacity, RowLoad
from .channel import Channel, ChannelClosed
from .connectors.base import Link, LinkClosed, LinkUnavailable
from .gpu_usage import GpuUsage
from .link_messages import (
    Abort,
    Alive,
    ChunkMessage,
    Done,
    DropTurn,
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
    EntryEngine,
    ErrorChunk,
    PipelineRequest,
    StageInput,
    StreamEngine,
    StreamingInput,
)

log = logging.getLogger("parley.pipeline.stage_client")

REQUEST_CHANNEL_SIZE = 64
RETRY_S = 0.5
"""How long the reader waits before reading again from a link whose transport is down."""
WATCH_S = 0.25
"""How often the watchdog looks at how long the stage has been silent (at most)."""


class LinkedStage(EntryEngine, StreamEngine, StreamingInput):
    def __init__(self, name: str, start_timeout_s: float, liveness_s: float | None = None) -> None:
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.liveness_s = liveness_s
        self.down_reason: str | None = None
        """Why the stage is down (hung, its link lost or unavailable); None while it answers."""
        self._link: Link | None = None
        self._readers = TaskSet(f"stage:{name}")
        """Owns the link's reader (one per attached link); `_detach()` closes it."""
        self._reader: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._heard = 0.0
        """When the stage last said anything (the event loop's clock)."""
        self._ready = asyncio.Event()
        self._closing = False
        self._broken = False
        """The far side said its engine broke (`Stuck.broken`): down until a new link."""
        self._requests: dict[str, Channel[Chunk]] = {}
        """per link key (a request's id and a count): where its chunks go"""
        self._keys: dict[str, str] = {}
        """per request id in flight: its link key (for `abort`)"""
        self._uses = itertools.count()
        self._stats: dict[int, asyncio.Future[int]] = {}
        self._tokens = itertools.count()
        self._capacity: Capacity | None = None
        """What the engine over there said it can serve (its `Ready` or heartbeat)."""
        self._load: RowLoad | None = None
        """Its rows at its last heartbeat."""
        self._streams = False
        """The engine over there takes streamed turns (its `Ready` said so)."""
        self._streamed: dict[str, int] = {}
        """How its streamed turns ended, at its last heartbeat."""
        self._gpu: GpuUsage | None = None
        """Its process's GPU memory, at its last heartbeat."""

    # --- for subclasses ------------------------------------------------------------------

    def _attach(self, link: Link) -> None:
        """Start serving requests over `link` (the stage said it is ready)."""
        self._link = link
        self._broken = False
        self._heard = asyncio.get_running_loop().time()
        self._mark_up()
        self._reader = self._readers.create_task(self._read(link), name=f"stage:{self.name}:reader")
        if self.liveness_s is not None and self._watchdog is None:
            # a watch that ended silently would leave a hung stage unnoticed: logged at once
            self._watchdog = background(
                self._watch(self.liveness_s), name=f"stage:{self.name}:watchdog"
            )
        self._ready.set()

    async def _on_lost(self) -> None:
        """Called (in the reader task) once the link is lost and requests were failed."""

    def _on_hung(self, reason: str) -> None:
        """Called once the stage is found hung (its requests were failed): a subclass that
        owns the stage's process kills it here."""

    lost_reason = "its link was lost"
    """What `down_reason` says from a lost link until a new one is attached."""

    async def _detach(self) -> None:
        """Stop reading and close the link (for close()); idempotent."""
        self._closing = True
        reader, self._reader = self._reader, None
        link, self._link = self._link, None
        watchdog, self._watchdog = self._watchdog, None
        await cancel_and_wait(watchdog)
        if reader is not None:
            reader.cancel()
        # The link closes before the reader is awaited: redis-py can swallow a cancellation
        # that lands inside a blocking XREAD (it disconnects and carries on), and the
        # reader's next read then finds the link closed and ends, instead of reading on
        # while this waits for it (seen as a 60 s hang under load).
        if link is not None:
            await link.close()
        await self._readers.close()

    # --- the reader ----------------------------------------------------------------------

    async def _read(self, link: Link) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    message = await link.recv()
                except LinkUnavailable as exc:
                    self._mark_down(str(exc))
                    await asyncio.sleep(RETRY_S)
                    continue
                self._heard = loop.time()
                if isinstance(message, Ready):  # a fresh process (a remote stage's link)
                    self._broken = False
                elif self._broken:  # what its last moments send changes nothing: it is going
                    continue
                if isinstance(message, Stuck):
                    if message.broken:  # it exits by itself: its requests fail, no kill
                        self._broken = True
                        self._mark_down(message.reason)
                    elif self.down_reason is None:
                        self._hung(f"hung: {message.reason}")
                    continue
                self._mark_up()
                match message:
                    case ChunkMessage(rid, chunk):
                        if (channel := self._requests.get(rid)) is not None:
                            with contextlib.suppress(ChannelClosed):
                                await channel.send(chunk)
                    case Done(rid):
                        if (finished := self._requests.get(rid)) is not None:
                            finished.close()
                    case StatsReply(token, active):
                        future = self._stats.pop(token, None)
                        if future is not None and not future.done():
                            future.set_result(active)
                    case Ready():
                        self._heard_ready(message)
                    case Alive(capacity, load, streamed, gpu):
                        self._capacity, self._load, self._gpu = capacity, load, gpu
                        self._streams = streamed is not None
                        self._streamed = streamed or {}
                    case _:
                        pass
        except LinkClosed:
            pass
        finally:
            await self._lost(link)

    async def _watch(self, liveness_s: float) -> None:
        """Find the stage hung once it has been silent for `liveness_s` (a watchdog beside
        the reader, whose receive must not be cut in the middle of a message)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(WATCH_S, liveness_s / 4))
            silent = loop.time() - self._heard > liveness_s
            if silent and self.down_reason is None and not self._closing:
                self._hung(f"hung: no word from it for {liveness_s:g} s")

    def _hung(self, reason: str) -> None:
        self._mark_down(reason)
        self._on_hung(reason)

    def _mark_down(self, reason: str) -> None:
        """Fail every request in flight; log once per outage, not once per retry."""
        if self.down_reason is None:
            log.warning("stage %s is not answering: %s", self.name, reason)
        self.down_reason = reason
        for channel in list(self._requests.values()):
            if not channel.closed:
                channel.close_with(
                    ErrorChunk(f"the {self.name} stage stopped answering ({reason})", self.name)
                )

    def _mark_up(self) -> None:
        if self.down_reason is not None:
            log.info("stage %s is answering again", self.name)
            self.down_reason = None

    def stalled(self, bound_s: float) -> str | None:
        """The stage as seen from here: why it is down, or None while it answers."""
        return self.down_reason

    async def _lost(self, link: Link) -> None:
        self._ready.clear()
        for key, channel in list(self._requests.items()):
            rid = key.rpartition("#")[0]
            if not channel.closed:  # a hung stage's requests have their reason already
                message = f"the {self.name} stage stopped while serving {rid} ({self.lost_reason})"
                channel.close_with(ErrorChunk(message, self.name))
        for future in self._stats.values():
            if not future.done():
                future.set_exception(LinkClosed("the stage is gone"))
        self._stats.clear()
        if self._link is link:
            self._link = None
            await link.close()
        if not self._closing:
            if self.down_reason is None:
                self._mark_down(self.lost_reason)
            await self._on_lost()

    # --- the engine contract -------------------------------------------------------------

    def active_requests(self) -> int:
        return len(self._requests)

    def capacity(self) -> Capacity | None:
        """The far engine's figures, as it last said them (kept while it restarts: the
        stage will serve the same again)."""
        return self._capacity

    def row_load(self) -> RowLoad | None:
        return self._load

    def gpu_usage(self) -> GpuUsage | None:
        """The far process's GPU memory at its last heartbeat (None: it has not started
        CUDA, or has not beaten yet)."""
        return self._gpu

    def _heard_ready(self, ready: Ready | Alive) -> None:
        """The far side's first word: what it can serve, and whether it takes streamed
        turns."""
        self._capacity = ready.capacity
        match ready:
            case Ready(streams_input=streams):
                self._streams = streams
            case Alive(streamed=streamed):
                self._streams = streamed is not None

    async def remote_active_requests(self) -> int:
        """How many requests the engine on the other side holds (for tests and checks)."""
        link = await self._live_link()
        token = next(self._tokens)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._stats[token] = future
        await link.send(Stats(token))
        return await future

    async def _live_link(self) -> Link:
        async with asyncio.timeout(self.start_timeout_s):
            await self._ready.wait()
        assert self._link is not None
        return self._link

    async def abort(self, request_id: str) -> None:
        if (key := self._keys.get(request_id)) is not None:
            await self._abort_key(request_id, key)

    async def _abort_key(self, request_id: str, key: str) -> None:
        self._forget(request_id, key)
        if self._link is not None:
            with contextlib.suppress(LinkClosed, LinkUnavailable):
                await self._link.send(Abort(key))

    def _forget(self, request_id: str, key: str) -> None:
        """Stop routing anything that comes for this use of the id."""
        if (channel := self._requests.pop(key, None)) is not None:
            channel.discard()
        if self._keys.get(request_id) == key:
            del self._keys[request_id]

    async def forget_session(self, session_id: str) -> None:
        """Passed on to the engine over the link; a stage that is gone has nothing to drop
        (a restarted worker starts empty)."""
        if self._link is not None:
            with contextlib.suppress(LinkClosed, LinkUnavailable):
                await self._link.send(ForgetSession(session_id))

    # --- streamed turns (StreamingInput), passed on as forget_session is --------------------

    def takes_streamed_turns(self) -> bool:
        """While the engine over there said it takes them and the link is up."""
        return self._streams and self._link is not None and self.down_reason is None

    def streamed_turns(self) -> dict[str, int]:
        return dict(self._streamed)

    async def open_turn(self, turn_id: str, context: PipelineRequest) -> None:
        await self._send_turn_call(OpenTurn(turn_id, context))

    async def feed_turn(self, turn_id: str, pcm: npt.NDArray[np.int16]) -> None:
        await self._send_turn_call(FeedTurn(turn_id, pcm))

    async def drop_turn(self, turn_id: str) -> None:
        await self._send_turn_call(DropTurn(turn_id))

    async def _send_turn_call(self, call: OpenTurn | FeedTurn | DropTurn) -> None:
        """Sent if the stage is up; let go otherwise (a restarted stage has no turns)."""
        if self._link is not None and self.down_reason is None:
            with contextlib.suppress(LinkClosed, LinkUnavailable):
                await self._link.send(call)

    async def generate(
        self, request_id: str, inputs: PipelineRequest | StageInput
    ) -> AsyncGenerator[Chunk, None]:
        """Forward a request, and for a stream stage its upstream chunks as they come."""
        if self.down_reason is not None:
            yield ErrorChunk(
                f"the {self.name} stage is not answering ({self.down_reason})", self.name
            )
            return
        try:
            link = await self._live_link()
        except TimeoutError:
            yield ErrorChunk(f"the {self.name} stage is not running", self.name)
            return
        channel: Channel[Chunk] = Channel(REQUEST_CHANNEL_SIZE)
        key = f"{request_id}#{next(self._uses)}"
        self._requests[key] = channel
        self._keys[request_id] = key
        upstream: StageInput | None
        match inputs:
            case StageInput():
                request, upstream = inputs.request, inputs
            case PipelineRequest():
                request, upstream = inputs, None
        # a TaskSet and not a TaskGroup: its scope spans this generator's yields
        feeding = TaskSet(f"{key}:feeder")
        finished = False
        try:
            await link.send(Generate(key, request, streamed=upstream is not None))
            if upstream is not None:
                feeding.create_task(self._feed(link, key, upstream))
            async for chunk in channel:
                yield chunk
                if isinstance(chunk, End | ErrorChunk):
                    finished = True
                    return
            finished = True
        except LinkClosed:
            finished = True
            yield ErrorChunk(f"the {self.name} stage stopped ({self.lost_reason})", self.name)
        except LinkUnavailable as exc:
            finished = True
            self._mark_down(str(exc))
            yield ErrorChunk(f"the {self.name} stage is not answering ({exc})", self.name)
        finally:
            await feeding.close()
            if finished:
                self._forget(request_id, key)
            else:
                await self._abort_key(request_id, key)

    async def _feed(self, link: Link, key: str, inputs: StageInput) -> None:
        """Forward the upstream chunks of a streamed request to the stage."""
        with contextlib.suppress(LinkClosed, LinkUnavailable):
            async for chunk in inputs.chunks:
                await link.send(Input(key, chunk))
            await link.send(InputEnd(key))
