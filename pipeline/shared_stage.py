"""A stage served by this host's stage host, seen from a server process as an Engine.

With `parley serve --workers N` the parent runs each worker-placed stage once, in a stage
host (`stage_host.py`); every server process reaches it through `SharedStageEngine`, which
dials the host's unix socket and speaks the same link a worker process of its own would
(shared memory for arrays, the socket for headers). The host may still be loading when a
server process starts, so `start` keeps dialling until the host answers or the start timeout
passes. If the host goes away (it died and the parent is starting it again), the requests
in flight fail at once and the link is dialled again, as a dead worker is restarted. A host
that hangs is found here as a hung worker is (its requests fail at once, the stage is down),
but killed by the parent, which watches the hosts' own heartbeats (`web/workers.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from .connectors.shm_dial import dial
from .graph_config import DEFAULT_HANG_S
from .reconnecting_stage import ReconnectingStage, StageLinkFailed

log = logging.getLogger("parley.pipeline.shared_stage")

DIAL_RETRY_S = 0.1


class SharedStageEngine(ReconnectingStage):
    lost_reason = "its stage host went away; dialling it again"

    def __init__(
        self,
        stage: str,
        path: str,
        start_timeout_s: float = 300.0,
        hang_s: float = DEFAULT_HANG_S,
    ) -> None:
        super().__init__(stage, start_timeout_s, liveness_s=hang_s)
        self.path = path

    async def start(self) -> None:
        """Dial until the host serves (it may still be loading its engine)."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                await super().start()
                return
            except StageLinkFailed:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(DIAL_RETRY_S)

    async def _establish(self) -> None:
        try:
            link = await dial(self.path)
        except OSError as exc:
            problem = f"stage {self.name}: no stage host on {self.path} ({exc})"
            raise StageLinkFailed(problem) from None
        await self._first_word(link)
        self._attach(link)
        log.info("stage %s: served by the stage host on %s", self.name, self.path)

    def shared_by_processes(self) -> bool:
        return True  # the host serves every server process of `--workers N`

    async def close(self) -> None:
        """Hang up (the host ends this process's requests and serves on). Idempotent."""
        await self._stop_supervisor()
        await self._detach()
