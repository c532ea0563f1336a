"""Links: how messages (chunks, requests, control) cross from one stage host to another.

A link is a bounded, ordered, duplex pipe of Python messages that may contain numpy arrays.
Array data never goes through pickle: messages are pickled with protocol 5 and their array
buffers are taken out of band (`encode`), so a connector can move them its own way (shared
memory, a Redis stream field) and the receiver rebuilds arrays around those buffers
(`decode`) without another copy. A stage link's messages are the dataclasses of
`pipeline/link_messages.py`; a link itself carries any picklable message.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, Protocol


class LinkClosed(Exception):
    """The other side is gone (closed, crashed or disconnected)."""


class LinkUnavailable(Exception):
    """The link's transport failed for now (its Redis is down or restarting). Unlike
    LinkClosed this says nothing about the other side, and the same link may work again."""


class Link(Protocol):
    async def send(self, message: Any) -> None:
        """Send one message; waits while the link is full."""
        ...

    async def recv(self) -> Any:
        """The next message; raises LinkClosed when the other side is gone, and
        LinkUnavailable while the transport is down (a link that can recover)."""
        ...

    async def close(self) -> None:
        """Idempotent."""
        ...


def encode(message: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle `message`, keeping array buffers out of band (raw, contiguous, uncopied)."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    return header, [buffer.raw() for buffer in buffers]


def decode(header: bytes, buffers: Sequence[Any]) -> Any:
    """Rebuild a message; arrays become views onto `buffers` (no copy)."""
    return pickle.loads(header, buffers=buffers)
