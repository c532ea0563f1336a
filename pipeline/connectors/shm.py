"""The shared-memory link between two processes on one host.

Each direction has a ring buffer in shared memory for array data and shares one unix
socket for small headers. The sender copies each out-of-band array buffer into its ring
once and sends (offset, length) with the pickled header; the receiver rebuilds the arrays as
views straight onto the ring, so array data is copied exactly once and never pickled.

A view keeps its ring segment allocated. When the last array built on a segment is garbage-
collected, a finalizer marks the segment free and the receiver advances the ring's tail (stored
in the ring's first bytes), which is how the sender learns there is room. Small buffers (up to
INLINE_MAX) go through the socket instead, and so does any buffer the ring has no room for right
now, up to BLOCK_MIN; a larger one (a long conversation's hidden states for the Talker: 59 MiB
at 3,800 positions) goes in a shared-memory block of its own, which the receiver copies out and
unlinks (through the socket it cost ~3 ms a MiB here, 178 ms for those 59 MiB:
`ShmLink._one_off_block`, `python -m loadtest.prompt_states_bench`). The sender never waits for
ring space. Waiting would deadlock a link that several requests share. The sender holds the
link's lock while it waits, so every later message queues behind it, and the segment it waits
for may be held by a reader that will only let go once one of those later messages arrives (a
stage keeping request A's prompt while it waits for A's next chunk, as request B's prompt waits
for room). Consumers that keep arrays for long should still copy them: a held segment keeps the
ring's tail, so everything behind it takes the slower socket path until it is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import pickle
import socket
import struct
import threading
import weakref
from dataclasses import dataclass, field
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from .base import LinkClosed, decode, encode

log = logging.getLogger("parley.pipeline.shm")

HEADER = 64
"""Bytes at the start of a ring: the tail counter (uint64), written by the reader only."""
ALIGN = 64
DEFAULT_CAPACITY = 16 * 1024 * 1024
"""Per direction. Segments live in /dev/shm: keep two per worker within its size."""
INLINE_MAX = 16 * 1024
"""Buffers up to this size ride in the socket frame: a ring slot would cost more than it saves."""
BLOCK_MIN = 1024 * 1024
"""A buffer the ring has no room for goes through the socket up to this size, and in a
one-off shared-memory block above it (its creation and page faults cost less than the
socket's copies from about here on)."""
SENT_BLOCKS = 64
"""One-off blocks a sender remembers, to unlink at its close those never received."""
_CREATED_HERE: set[str] = set()
"""Segments this process created (an in-process pair must not untrack its own rings)."""
_LEN = struct.Struct("<I")
_TAIL = struct.Struct("<Q")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class _Segment:
    end: int
    released: bool = False


@dataclass
class RingSpec:
    """What the other process needs to attach: names of the two rings and the socket."""

    send_ring: str
    recv_ring: str
    capacity: int

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON carries it (a worker's command line, a dialled host's hello)."""
        return {"send": self.send_ring, "recv": self.recv_ring, "capacity": self.capacity}

    @classmethod
    def from_dict(cls, body: Any) -> RingSpec:
        """The spec `to_dict` made; ValueError if `body` is not one."""
        try:
            return cls(str(body["send"]), str(body["recv"]), int(body["capacity"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a ring spec: {exc!r}") from None


class _Ring:
    def __init__(self, shm: shared_memory.SharedMemory, capacity: int, owner: bool) -> None:
        self.shm = shm
        assert shm.buf is not None
        self.buf: memoryview = shm.buf
        self.capacity = capacity
        self.owner = owner
        self.head = 0  # writer side: absolute bytes allocated
        self._segments: collections.deque[_Segment] = collections.deque()
        self._lock = threading.Lock()  # finalizers may run on another thread
        self._closed = False

    @classmethod
    def create(cls, capacity: int) -> _Ring:
        ring = cls(shared_memory.SharedMemory(create=True, size=HEADER + capacity), capacity, True)
        _TAIL.pack_into(ring.buf, 0, 0)
        _CREATED_HERE.add(ring.shm.name)
        return ring

    @classmethod
    def attach(cls, name: str, capacity: int) -> _Ring:
        shm = shared_memory.SharedMemory(name=name)
        # Attaching registers the segment with this process's resource tracker, which would
        # unlink it when this process exits; the creator owns it and unlinks it.
        if name not in _CREATED_HERE:
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]  # noqa: SLF001
        return cls(shm, capacity, owner=False)

    @property
    def tail(self) -> int:
        return int(_TAIL.unpack_from(self.buf, 0)[0])

    # --- writer side ---
    def try_alloc(self, nbytes: int) -> int | None:
        """Absolute start of a free region of `nbytes`, or None if there is no room yet."""
        size = _align(nbytes)
        pos = self.head % self.capacity
        pad = self.capacity - pos if pos + size > self.capacity else 0
        if self.head + pad + size - self.tail > self.capacity:
            return None
        start = self.head + pad
        self.head = start + size
        return start

    def write(self, start: int, data: memoryview) -> None:
        pos = HEADER + start % self.capacity
        self.buf[pos : pos + data.nbytes] = data.cast("B")

    # --- reader side ---
    def view(self, start: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        pos = HEADER + start % self.capacity
        base: np.ndarray[Any, np.dtype[np.uint8]] = np.ndarray(
            (nbytes,), dtype=np.uint8, buffer=self.buf, offset=pos
        )
        segment = _Segment(end=start + _align(nbytes))
        with self._lock:
            self._segments.append(segment)
        weakref.finalize(base, self._release, segment)
        return base

    def _release(self, segment: _Segment) -> None:
        with self._lock:
            segment.released = True
            tail = None
            while self._segments and self._segments[0].released:
                tail = self._segments.popleft().end
            if tail is not None and not self._closed:
                _TAIL.pack_into(self.buf, 0, tail)

    def close(self) -> None:
        if self._closed:
            return
        with self._lock:
            self._closed = True
        with contextlib.suppress(BufferError):  # arrays still view it: it goes with the process
            self.shm.close()
        if self.owner:
            _CREATED_HERE.discard(self.shm.name)
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


@dataclass
class ShmLink:
    """One end of a shared-memory link (a Link)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    send_ring: _Ring
    recv_ring: _Ring
    _closed: bool = False
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _sent_blocks: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=SENT_BLOCKS)
    )

    @classmethod
    def create_rings(cls, capacity: int = DEFAULT_CAPACITY) -> tuple[_Ring, _Ring, RingSpec]:
        """The creator's two rings, and the spec the other side attaches with (crossed)."""
        out, back = _Ring.create(capacity), _Ring.create(capacity)
        return (
            out,
            back,
            RingSpec(send_ring=back.shm.name, recv_ring=out.shm.name, capacity=capacity),
        )

    @classmethod
    async def open(cls, sock: socket.socket, send_ring: _Ring, recv_ring: _Ring) -> ShmLink:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer, send_ring, recv_ring)

    @classmethod
    async def attach(cls, sock: socket.socket, spec: RingSpec) -> ShmLink:
        send_ring = _Ring.attach(spec.send_ring, spec.capacity)
        recv_ring = _Ring.attach(spec.recv_ring, spec.capacity)
        return await cls.open(sock, send_ring, recv_ring)

    async def send(self, message: Any) -> None:
        if self._closed:
            raise LinkClosed("link closed")
        header, buffers = encode(message)
        async with self._send_lock:  # one message's segments stay contiguous and in order
            segments: list[tuple[int, int]] = []
            inline: list[bytes] = []
            blocks: list[tuple[str, int]] = []
            for buffer in buffers:
                start = None
                if buffer.nbytes > INLINE_MAX:
                    start = self.send_ring.try_alloc(buffer.nbytes)
                if start is None and buffer.nbytes > BLOCK_MIN:
                    segments.append((-2, len(blocks)))
                    blocks.append((self._one_off_block(buffer), buffer.nbytes))
                    continue
                if start is None:
                    segments.append((-1, len(inline)))
                    inline.append(bytes(buffer))
                    continue
                self.send_ring.write(start, buffer)
                segments.append((start, buffer.nbytes))
            frame = pickle.dumps((header, segments, inline, blocks), protocol=5)
            try:
                self.writer.write(_LEN.pack(len(frame)) + frame)
                await self.writer.drain()
            except (ConnectionError, OSError) as exc:
                raise LinkClosed(f"link lost: {exc}") from None

    async def recv(self) -> Any:
        if self._closed:
            raise LinkClosed("link closed")
        try:
            (length,) = _LEN.unpack(await self.reader.readexactly(_LEN.size))
            frame = await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            raise LinkClosed("the other side is gone") from None
        header, segments, inline, blocks = pickle.loads(frame)
        buffers = [
            inline[size]
            if start == -1
            else _copied_out(*blocks[size])
            if start == -2
            else self.recv_ring.view(start, size)
            for start, size in segments
        ]
        return decode(header, buffers)

    def _one_off_block(self, buffer: memoryview) -> str:
        """`buffer` in a shared-memory block of its own, for a buffer larger than the ring
        has room for; its name. The receiver unlinks it (`_copied_out`); this side's close
        unlinks the last SENT_BLOCKS sent, in case they were never received."""
        block = shared_memory.SharedMemory(create=True, size=buffer.nbytes)
        # The receiver unlinks it: this process's resource tracker must not (nor warn).
        resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]  # noqa: SLF001
        try:
            assert block.buf is not None
            block.buf[: buffer.nbytes] = buffer.cast("B")
        finally:
            block.close()
        self._sent_blocks.append(block.name)
        return block.name

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        self.send_ring.close()
        self.recv_ring.close()
        while self._sent_blocks:
            _unlink(self._sent_blocks.popleft())


def _copied_out(name: str, nbytes: int) -> bytearray:
    """A one-off block's bytes, copied out; the block is unlinked (a message's arrays must
    not keep a block each alive: the copy is one memcpy)."""
    block = shared_memory.SharedMemory(name=name)  # tracked until its unlink below
    try:
        assert block.buf is not None
        data = bytearray(block.buf[:nbytes])
    finally:
        block.close()
        with contextlib.suppress(FileNotFoundError):
            block.unlink()
    return data


def _unlink(name: str) -> None:
    """Unlink a one-off block that may have been received (and unlinked) already."""
    with contextlib.suppress(FileNotFoundError):
        block = shared_memory.SharedMemory(name=name)  # tracked until its unlink
        block.close()
        block.unlink()
