"""The gate in front of an engine's cache rows: a turn takes a row before it runs, or waits.

An engine with `rows` static cache rows can decode that many requests at once. Before this
gate, a request that found every row taken was stepped the plain transformers way inside
the same batched step, and every session's next token waited for it. Here a turn takes a
row first (the Thinker before its prefill, the Talker before its first step); when every
row is taken it waits its turn, first come first served, in a bounded queue (`waiting`
turns at most) for at most `wait_s`, and then either gets the row a finishing turn gives
back, or fails with `RowsBusy` (which the engine answers as an `ErrorChunk` with code
`server_busy`). A turn that finds the queue full fails at once: a queue that only grows
would answer nobody in time.

A waiting turn that is cancelled (its request aborted, its session gone) or abandoned by
id (`abandon`, from the engine's `abort`) leaves the queue and holds nothing. A row given
back goes straight to the oldest waiter, so a turn arriving meanwhile cannot overtake it.

Everything here runs on the event loop; the rows themselves (`slot_cache.py`) are taken on
the model thread at the request's first step, which the gate guarantees finds one free.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from .capacity import RowLoad

log = logging.getLogger("parley.pipeline.rows")


class RowsBusy(Exception):
    """No row within the wait (or the queue was full): the message says how many were busy
    and how long the turn waited."""


class RowGate:
    def __init__(
        self,
        stage: str,
        rows: int,
        *,
        waiting: int | None = None,
        wait_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rows < 1:
            raise ValueError("a row gate needs at least one row")
        if waiting is not None and waiting < 0:
            raise ValueError("waiting must be at least 0")
        if wait_s < 0:
            raise ValueError("row_wait_s must be at least 0")
        self.stage = stage
        self.rows = rows
        self.waiting = rows if waiting is None else waiting
        """Turns that may wait for a row at once (default: as many as there are rows)."""
        self.wait_s = wait_s
        self.clock = clock
        self.refused = 0
        """Turns refused (queue full or wait past) since the start."""
        self._holders: set[str] = set()
        self._queue: OrderedDict[str, asyncio.Future[None]] = OrderedDict()
        """Waiting turns by request id, oldest first; each is answered when handed a row."""

    @property
    def in_use(self) -> int:
        """Rows held now."""
        return len(self._holders)

    @property
    def queued(self) -> int:
        """Turns waiting for a row now."""
        return len(self._queue)

    def load(self) -> RowLoad:
        return RowLoad(in_use=self.in_use, waiting=len(self._queue), refused=self.refused)

    def holds(self, request_id: str) -> bool:
        return request_id in self._holders

    async def take(self, request_id: str) -> bool:
        """A row for `request_id`: True once held; False when the turn was abandoned while
        it waited (it holds nothing then). Raises RowsBusy when none came within `wait_s`
        or the queue is full; CancelledError leaves the queue holding nothing."""
        if request_id in self._holders or request_id in self._queue:
            raise ValueError(f"request {request_id!r} already holds or waits for a row")
        if self.in_use < self.rows and not self._queue:
            self._grant(request_id)
            return True
        if len(self._queue) >= self.waiting:
            self._refuse(
                f"all {self.rows} rows of {self.stage} are busy and all {self.waiting} "
                "places to wait for one are taken; try again shortly",
                0.0,
            )
        began = self.clock()
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue[request_id] = ticket
        try:
            async with asyncio.timeout(self.wait_s):
                await ticket
        except TimeoutError:
            self._leave(request_id, ticket)
            waited = self.clock() - began
            self._refuse(
                f"all {self.rows} rows of {self.stage} stayed busy for the {waited:.1f} s "
                "this turn waited; try again shortly",
                waited,
            )
        except asyncio.CancelledError:
            self._leave(request_id, ticket)
            raise
        except _Abandoned:
            return False
        return True

    def give_back(self, request_id: str) -> None:
        """`request_id`'s row goes to the oldest waiter, or back to the free rows.
        Idempotent: a turn that holds no row gives nothing back."""
        if request_id not in self._holders:
            return
        self._holders.discard(request_id)
        self._hand_on()

    def abandon(self, request_id: str) -> None:
        """A waiting turn's request was aborted: it leaves the queue (its `take` answers
        False). A turn holding a row gives it back with `give_back`, not here."""
        ticket = self._queue.pop(request_id, None)
        if ticket is not None and not ticket.done():
            ticket.set_exception(_Abandoned())

    def close(self) -> None:
        """Every waiting turn leaves (as if abandoned). Idempotent."""
        for request_id in list(self._queue):
            self.abandon(request_id)

    def _grant(self, request_id: str) -> None:
        self._holders.add(request_id)

    def _hand_on(self) -> None:
        while self.in_use < self.rows and self._queue:
            request_id, ticket = self._queue.popitem(last=False)
            if ticket.done():
                continue
            self._grant(request_id)
            ticket.set_result(None)

    def _leave(self, request_id: str, ticket: asyncio.Future[None]) -> None:
        """A waiter gives up: out of the queue, and a row it was handed meanwhile (the
        timeout or the cancellation landed after the hand-over) goes on to the next."""
        if self._queue.get(request_id) is ticket:
            del self._queue[request_id]
        if ticket.done() and not ticket.cancelled() and ticket.exception() is None:
            self.give_back(request_id)
        elif not ticket.done():
            ticket.cancel()

    def _refuse(self, message: str, waited: float) -> None:
        self.refused += 1
        log.warning(
            "%s: a turn refused (server_busy) after %.1f s: %s", self.stage, waited, message
        )
        raise RowsBusy(message)


class _Abandoned(Exception):
    """A waiting turn's request was aborted."""
