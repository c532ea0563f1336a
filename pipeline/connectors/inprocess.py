"""The in-process link: two bounded channels, messages passed by reference (zero copies)."""

from __future__ import annotations

from typing import Any

from ..channel import Channel, ChannelClosed
from .base import LinkClosed


class InProcessLink:
    def __init__(self, inbox: Channel[Any], outbox: Channel[Any]) -> None:
        self._inbox = inbox
        self._outbox = outbox

    @classmethod
    def pair(cls, maxsize: int = 64) -> tuple[InProcessLink, InProcessLink]:
        a_to_b: Channel[Any] = Channel(maxsize)
        b_to_a: Channel[Any] = Channel(maxsize)
        return cls(b_to_a, a_to_b), cls(a_to_b, b_to_a)

    async def send(self, message: Any) -> None:
        try:
            await self._outbox.send(message)
        except ChannelClosed:
            raise LinkClosed("the other side closed the link") from None

    async def recv(self) -> Any:
        try:
            return await self._inbox.recv()
        except ChannelClosed:
            raise LinkClosed("the other side closed the link") from None

    async def close(self) -> None:
        self._outbox.close()
        self._inbox.discard()
