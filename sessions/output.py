"""Where a session's output goes: its client's sink and its event log.

Every event a session sends goes to its client's sink (the connection's `OutputSink`, or a
`DetachedSink` while the client is gone and may come back) and into the event log, which a
client that resumes replays (event_log.py). A session handed over to another process
(`moving`) sends nothing more to the sink but its goodbye (the connection alone hears why),
and once what it recorded has reached Redis (`go_quiet`) it records nothing more either:
the log is the next owner's.
"""

from __future__ import annotations

import asyncio
import logging

from .events import Event
from .sink import DetachedSink, OutputSink
from .store import SessionStore

log = logging.getLogger("parley.sessions.output")

FLUSH_TIMEOUT_S = 5.0


class SessionOutput:
    def __init__(self, sink: OutputSink, store: SessionStore) -> None:
        self.sink = sink
        self._store = store
        self.moving = False
        """Handed over to another process: it ends here silently and keeps its keys."""
        self.quiet = False
        """Nothing more goes into the event log (another process owns it now)."""

    def emit(self, event: Event) -> None:
        if not self.moving:
            self.sink.event(event)
        if not self.quiet:
            self._store.event_log.record(event)

    def detach(self) -> None:
        """The client is gone: output goes nowhere until a client attaches a sink."""
        self.sink = DetachedSink()

    async def go_quiet(self) -> None:
        """Handing over: what was recorded so far reaches Redis, then nothing more does
        (the answer in progress is ended as cancelled by the next owner, from the log)."""
        store = self._store
        if self.quiet:
            await store.spill.aclose()
            return
        try:
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                await store.audio.flush()
                await store.event_log.flushed()
        except Exception as exc:
            log.warning("session %s: handed over with writes unflushed: %r", store.session_id, exc)
        self.quiet = True
        await store.spill.aclose()
