"""Which asyncio event loop a server process runs on.

uvloop (libuv under asyncio's interface) is the default where it is installed: the server
spends most of its time in the loop's plumbing (socket reads and writes, callbacks, timer
handles), and with 200 sessions streaming OpenAI-WebSocket audio uvloop took the server's
CPU per 20 ms chunk from 166 to 151 us (`python -m loadtest.ws_stream_bench --workers 2`),
with the chunk lag's p95 from 56 to 27 ms. `--loop asyncio` keeps the standard loop (for a
debugger, or a library that needs it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOPS = ("auto", "uvloop", "asyncio")


class LoopUnavailable(RuntimeError):
    pass


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for loop `name` (None: asyncio's own). `auto` is uvloop if installed."""
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise LoopUnavailable("--loop uvloop: uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], loop: str = "auto") -> T:
    """`asyncio.run(main)` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(main)


def name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`: which kind `loop` is, for the log."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
