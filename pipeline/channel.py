"""A bounded, closable channel between two stages (or a stage and the caller).

`send` waits while the channel is full, which is the backpressure that keeps a slow
consumer from growing memory anywhere upstream. `close` ends the stream for the reader
after what was already sent; iterating stops there.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

T = TypeVar("T")


class ChannelClosed(Exception):
    pass


class Channel(Generic[T]):
    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("a channel holds at least one item")
        self.maxsize = maxsize
        self._items: collections.deque[T] = collections.deque()
        self._closed = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, item: T) -> None:
        while len(self._items) >= self.maxsize and not self._closed:
            self._writable.clear()
            await self._writable.wait()
        if self._closed:
            raise ChannelClosed("send on a closed channel")
        self._items.append(item)
        self._readable.set()

    async def recv(self) -> T:
        """The next item; raises ChannelClosed once closed and drained."""
        while not self._items:
            if self._closed:
                raise ChannelClosed("channel closed")
            self._readable.clear()
            await self._readable.wait()
        item = self._items.popleft()
        self._writable.set()
        return item

    def close(self) -> None:
        """No more items will be sent; idempotent."""
        self._closed = True
        self._readable.set()
        self._writable.set()

    def close_with(self, item: T) -> None:
        """Drop what is queued, make `item` the last thing the reader gets, and close."""
        self._items.clear()
        self._items.append(item)
        self.close()

    def discard(self) -> None:
        """Close and drop what is queued (the reader is gone)."""
        self.close()
        self._items.clear()

    async def __aiter__(self) -> AsyncIterator[T]:
        while True:
            try:
                yield await self.recv()
            except ChannelClosed:
                return
