"""A stage in this server process whose engine broke for good: the server exits to recover.

A sticky device error (`pipeline/device_faults.py`) leaves the CUDA context of the process
that met it unusable, and a process cannot make a new one. A stage placed in a worker
process or a stage host ends that process, which is started again; a stage placed in the
server's own process (`placement: {process: main}`) can only end the server. So the server
watches its pipeline's stages (`StageGraph.broken_stages`, every `POLL_S`) and, once one is
broken, logs why, waits `GRACE_S` (the requests in flight have failed with `model_error`
already, and new ones fail at once; their sessions' events go out meanwhile) and exits with
`BROKEN_EXIT` without the usual shutdown (closing the engine could hang on the failed
context). Its supervisor starts it again: the parent of `parley serve --workers N` does for
a worker; for a single server, systemd, Kubernetes or whatever runs it (restart on failure).
Sessions are lost with the process; clients reconnect as after any crash.
"""

from __future__ import annotations

import asyncio
import logging

from pipeline.device_faults import exit_now
from pipeline.graph import StageGraph
from pipeline.types import Pipeline
from pipeline.worker_main import BROKEN_EXIT

log = logging.getLogger("parley.web")

POLL_S = 0.5
GRACE_S = 1.0


async def exit_when_broken(pipeline: Pipeline, poll_s: float = POLL_S) -> None:
    """Watch `pipeline`'s in-process stages; exit the process once one broke."""
    if not isinstance(pipeline, StageGraph):
        return
    while True:  # polled: nothing tells the loop of a model thread's error
        if broken := pipeline.broken_stages():
            break
        await asyncio.sleep(poll_s)
    for stage, reason in broken.items():
        log.critical(
            "stage %s in this server process is broken (%s): the process cannot recover its "
            "device; exiting with status %d in %g s so that its supervisor starts it again",
            stage,
            reason,
            BROKEN_EXIT,
            GRACE_S,
        )
    await asyncio.sleep(GRACE_S)
    exit_now(BROKEN_EXIT)
