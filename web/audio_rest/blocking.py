"""Model work off the event loop, with the thread's end awaited even when the caller goes.

Whisper's decoding and Piper's ONNX calls take tens to hundreds of milliseconds of CPU; on
the event loop they would stall every live session's 20 ms frames. They run on the loop's
default thread pool instead. A request cancelled mid-call (the client hung up) cannot stop
the thread, so `off_loop` waits for it, shielded, before the cancellation goes on: the
request's admission slot is held until the model is really free, and nothing runs on
behind its owner's back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` on a worker thread; on cancellation, the thread's end awaited."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_retrieved)  # its error, if any, goes with the request
        with contextlib.suppress(asyncio.CancelledError):  # a second cancel: stop waiting
            await asyncio.wait({future})
        raise


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
