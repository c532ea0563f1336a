"""A stage served elsewhere whose link is made again whenever it is lost.

Two kinds of stage share this: a stage in a worker process of our own (`WorkerEngine`: the
link is made by spawning the worker) and a stage shared by the server processes of a host
(`SharedStageEngine`: made by dialling the stage host). Either way the far side says `Ready`
(or `Fatal`) first; once the link is lost, every request in flight has failed (`LinkedStage`)
and a supervisor task makes the link again, with a growing pause while that keeps failing.
Meanwhile the stage is down (`LinkedStage.down_reason`): new requests fail at once. A stage
silent for `liveness_s` (its `hang_s`), or one that says it is stuck, is hung: its requests
fail at once, and its process is killed by whoever owns it (`WorkerEngine`: this process;
a stage host: the parent of the server processes), which ends the link like a death.
"""

from __future__ import annotations

import asyncio
import logging

from .connectors.base import Link, LinkClosed
from .link_messages import Fatal, Ready
from .stage_client import LinkedStage
from .tasks import background, cancel_and_wait

log = logging.getLogger("parley.pipeline.stage")

FIRST_RETRY_S = 0.5
MAX_RETRY_S = 10.0


class StageLinkFailed(RuntimeError):
    """The link to a stage could not be made (the message says why)."""


class ReconnectingStage(LinkedStage):
    """Subclasses make the link in `_establish` (which ends by `_attach`ing it, or raises
    StageLinkFailed) and may add to `_on_lost` and `close`."""

    def __init__(self, name: str, start_timeout_s: float, liveness_s: float | None) -> None:
        super().__init__(name, start_timeout_s, liveness_s)
        self.restarts = 0
        """How many times the link was made again after it was lost."""
        self._supervisor: asyncio.Task[None] | None = None
        self._lost_event = asyncio.Event()

    async def _establish(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        await self._establish()
        self._supervisor = background(self._supervise(), f"stage:{self.name}")

    async def _first_word(self, link: Link) -> None:
        """Wait for the far side's `Ready`; raise StageLinkFailed (the link closed) if it
        says anything else, or nothing within the start timeout."""
        try:
            async with asyncio.timeout(self.start_timeout_s):
                first = await link.recv()
        except (TimeoutError, LinkClosed) as exc:
            first = Fatal(f"it did not start ({exc!r})")
        except BaseException:  # cancelled while the far side loads: the link is nobody's
            await link.close()
            raise
        match first:
            case Ready():
                self._heard_ready(first)
                return
            case Fatal(message):
                problem = message
            case _:
                problem = f"it said {first!r} before it was ready"
        await link.close()
        raise StageLinkFailed(f"stage {self.name}: {problem}")

    async def _on_lost(self) -> None:
        self._lost_event.set()

    async def _supervise(self) -> None:
        """Make the link again whenever it is lost, until close()."""
        delay = FIRST_RETRY_S
        while True:
            await self._lost_event.wait()
            self._lost_event.clear()
            self.restarts += 1
            while True:
                try:
                    await self._establish()
                    delay = FIRST_RETRY_S
                    break
                except StageLinkFailed as exc:
                    log.error("%s; retrying in %.1f s", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_S)

    async def _stop_supervisor(self) -> None:
        self._closing = True
        supervisor, self._supervisor = self._supervisor, None
        await cancel_and_wait(supervisor)
