"""Shared-memory links over a listening unix socket, for a stage many processes share.

A worker process's link (`ShmLink`) is made by its parent: a socketpair and two rings whose
names go on the child's command line. A stage host serves processes that come and go on
their own (the server workers of `parley serve --workers N`, each restarted on its own), so
each of them dials the host's socket instead: the caller creates the two rings, sends their
names as the first frame (a 4-byte length, then JSON), and both ends then speak the link's
own framing on that connection. The caller owns the rings, as a worker's parent does: they
are unlinked when it closes, and by its resource tracker if it dies.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct

from .shm import DEFAULT_CAPACITY, RingSpec, ShmLink

_LEN = struct.Struct("<I")
MAX_HELLO = 4096
"""A hello is a few ring names; anything longer is not one of ours."""


class BadHello(ValueError):
    """The first frame on a connection was not a ring spec."""


async def dial(path: str, capacity: int = DEFAULT_CAPACITY) -> ShmLink:
    """Connect to the stage host listening on `path` and open a link with fresh rings.

    Raises OSError while nothing listens there (the host is still loading, or restarting)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, path)
        out, back, spec = ShmLink.create_rings(capacity)
        try:
            hello = json.dumps(spec.to_dict()).encode()
            await loop.sock_sendall(sock, _LEN.pack(len(hello)) + hello)
            return await ShmLink.open(sock, out, back)
        except BaseException:
            out.close()
            back.close()
            raise
    except BaseException:
        sock.close()
        raise


async def answer(sock: socket.socket) -> ShmLink:
    """The host's end of a dialled connection: read the hello, attach to the caller's rings."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    (size,) = _LEN.unpack(await _read_exactly(loop, sock, _LEN.size))
    if size > MAX_HELLO:
        raise BadHello(f"a hello of {size} bytes")
    try:
        spec = RingSpec.from_dict(json.loads(await _read_exactly(loop, sock, size)))
    except json.JSONDecodeError as exc:
        raise BadHello(f"not JSON: {exc}") from None
    except ValueError as exc:
        raise BadHello(str(exc)) from None
    return await ShmLink.attach(sock, spec)


async def _read_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes, and not one more: what follows belongs to the link."""
    data = bytearray()
    while len(data) < n:
        got = await loop.sock_recv(sock, n - len(data))
        if not got:
            raise ConnectionResetError("the caller hung up during its hello")
        data += got
    return bytes(data)
