"""A real three-node Redis Cluster for the tests that check Parley on a cluster.

Three `redis-server --cluster-enabled yes` on free loopback ports in a private directory,
joined by `redis-cli --cluster create` (no replicas), started once per test run. The leak
check in tests/conftest.py only sees the plain test Redis, so the `redis_cluster_url`
fixture checks the keys on every node after each test itself.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as redis_sync

NODES = 3
START_TIMEOUT_S = 20.0
NODE_TIMEOUT_MS = 15_000
"""Redis's default: a node is failed (CLUSTERDOWN everywhere, no replicas) after this."""


def _free_ports(n: int) -> list[int]:
    """`n` free loopback ports whose cluster bus ports (port + 10000) are free too."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10_000 > 65_535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        ports.append(port)
    return ports


class ClusterProcesses:
    """The nodes of one test cluster; `close()` kills them and removes their directory."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="parley-test-cluster-"))
        self.ports = _free_ports(NODES)
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """A URL naming one node, as a user would give `--redis-url`."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def clients(self) -> list[redis_sync.Redis]:
        return [redis_sync.Redis(host="127.0.0.1", port=p) for p in self.ports]

    def _node(self, port: int) -> subprocess.Popen[bytes]:
        exe = shutil.which("redis-server")
        assert exe is not None, "redis-server is not installed"
        return subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1"]
            + ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
            + ["--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
            + ["--appendonly", "no", "--save", "", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        assert cli is not None, "redis-cli is not installed"
        self._procs = [self._node(port) for port in self.ports]
        self._wait(lambda c: bool(c.ping()), "a node did not start")
        addresses = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT_S,
        )
        self._wait(
            lambda c: b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO"),
            "the cluster did not reach cluster_state:ok",
        )

    def kill_nodes(self, *indices: int) -> None:
        """These nodes die at once, like a crash (their slots are out of reach)."""
        for index in indices:
            self._procs[index].kill()
            self._procs[index].wait(10)

    def restart_nodes(self, *indices: int) -> None:
        """These nodes start again from their cluster config: same slots, no data."""
        for index in indices:
            self._procs[index] = self._node(self.ports[index])
        self._wait(
            lambda c: b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO"),
            "the cluster did not come back to cluster_state:ok",
        )

    def _wait(self, ready: Callable[[redis_sync.Redis], bool], failure: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        for client in self.clients():
            try:
                while True:
                    try:
                        if ready(client):
                            break
                    except redis_sync.ConnectionError:
                        pass
                    assert time.monotonic() < deadline, failure
                    time.sleep(0.05)
            finally:
                client.close()

    def all_keys(self) -> list[bytes]:
        """Every key on every node."""
        found: list[bytes] = []
        for client in self.clients():
            with client:
                found.extend(client.scan_iter(count=1000))
        return found

    def flush(self) -> None:
        for client in self.clients():
            with client:
                client.flushall()

    def close(self) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait(10)
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


_running: ClusterProcesses | None = None
_users = 0


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterProcesses]:
    """One cluster for the whole run, whichever test module asks first.

    Each module that imports this fixture gets its own session-scoped copy of it from
    pytest; they share one set of nodes, stopped when the last copy is torn down."""
    global _running, _users
    if _running is None:
        cluster = ClusterProcesses()
        try:
            cluster.start()
        except BaseException:
            cluster.close()
            raise
        _running = cluster
    _users += 1
    try:
        yield _running
    finally:
        _users -= 1
        if _users == 0:
            _running.close()
            _running = None


@pytest.fixture
def redis_cluster_url(redis_cluster: ClusterProcesses) -> Iterator[str]:
    """The cluster's URL for one test, which must leave no key on any node."""
    yield redis_cluster.url
    left = redis_cluster.all_keys()
    if left:
        redis_cluster.flush()
        pytest.fail(f"test left keys on the Redis Cluster: {sorted(left)[:10]}")
