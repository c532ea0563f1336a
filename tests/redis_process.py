"""A redis-server of a test's own, to stop and start again: outages a shared server can't have.

It listens on a unix socket in a private directory, keeps nothing on disk, and comes back
on the same socket after `kill()` + `start()` as an empty server, like a real restart.
`fill()` takes a server to its memory limit (`maxmemory`, `noeviction`), where it answers
reads and refuses writes with OOM, and `free()` takes it back.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis as redis_sync
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

START_TIMEOUT_S = 10.0
FILLER = "test:filler"
ROOM = 4 * 1024 * 1024
"""What `fill()` sets `maxmemory` to above the memory in use."""


class RedisProcess:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="parley-own-redis-"))
        self.socket = self.dir / "redis.sock"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None, "redis-server is not installed"
        self._proc = subprocess.Popen(
            [exe, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"]
            + ["--save", "", "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis_sync.Redis(unix_socket_path=str(self.socket))
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis_sync.ConnectionError:
                    assert time.monotonic() < deadline, "redis-server did not start"
                    time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """Gone at once, like a crash; the socket file is removed so clients fail fast."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
            self._proc = None
        self.socket.unlink(missing_ok=True)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


async def fill(redis: aioredis.Redis) -> None:
    """The server at its memory limit: `maxmemory` a little above what it uses (with
    `noeviction`), then a key grown until Redis refuses to grow it further. Only for a
    server of the test's own: the shared one would refuse the other tests' writes."""
    await redis.config_set("maxmemory-policy", "noeviction")
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", used + ROOM)
    chunk = b"\0" * (256 * 1024)
    for _ in range(4 * ROOM // len(chunk)):
        try:
            await redis.append(FILLER, chunk)
        except OutOfMemoryError:
            return
    raise AssertionError("Redis took more than its maxmemory")


async def free(redis: aioredis.Redis) -> None:
    """Memory freed: the filler goes (the limit stays)."""
    await redis.delete(FILLER)
