"""Sidebands on every worker: what a server process runs so that a sideband landing on
another worker process finds its session or call here (realtime/sideband_relay.py).

Two things, for the server's life: the relays (this process serves the sidebands other
workers relay to it, GPT-Live's and OpenAI Realtime's calls') and the call index (this
process's calls named in Redis, realtime/call_index.py, so other workers know where a
call id leads).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from pipeline.tasks import background, cancel_and_wait
from realtime.live.live_sideband import find_live_sideband
from realtime.sideband_relay import OP, SidebandRelays

from .live_ws import LIVE_SIDEBAND
from .realtime_ws import CALL_SIDEBAND, find_call_sideband
from .services import Running, Services


@contextlib.asynccontextmanager
async def serve_sidebands(services: Services, running: Running) -> AsyncIterator[None]:
    """Serve relayed sidebands and keep the call index until the server stops."""
    manager, index, redis = running.manager, running.call_index, services.redis
    if redis is None:
        yield
        return
    slow = services.slow_clients
    relays = SidebandRelays(redis, manager.beat)
    relays.serve(
        LIVE_SIDEBAND,
        lambda session_id: find_live_sideband(services.live_sessions, manager, session_id, slow),
    )
    relays.serve(CALL_SIDEBAND, lambda call_id: find_call_sideband(running, manager, call_id, slow))
    manager.serve_requests(OP, relays.on_request)
    indexing = background(index.run(running.call_ids), "call-index") if index else None
    try:
        yield
    finally:
        await cancel_and_wait(indexing)
        await relays.close()
        if index is not None:
            await index.close()
