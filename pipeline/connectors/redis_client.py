"""The async Redis client for a `--redis-url`: one server, or a Redis Cluster.

A cluster needs redis-py's cluster client (it follows the slot map and MOVED replies); a
plain client pointed at one node of a cluster fails on every key that lives elsewhere. So
the URL decides, in this order:

- `unix://...` (the embedded Redis, or any local socket): a plain client, as always; a
  cluster cannot be reached over a unix socket.
- `?cluster=yes` / `?cluster=no` on a TCP URL: a cluster client / a plain client, no
  questions asked (the parameter is removed before redis-py reads the URL).
- otherwise the server is asked once (`INFO cluster`): `cluster_enabled:1` means a cluster.
  If it cannot be asked (not up yet, INFO forbidden), the client is plain and a warning says
  to add `?cluster=yes` if the server is in fact a cluster.

Used by the server (web/app.py) and by stage links (remote.py). Every session key carries
the hash tag `{session_id}` (sessions/keys.py) and a stage link's two streams `{link name}`,
so one session's or one link's keys stay in one slot; the cluster client splits the rest
(a DEL of several sessions' keys) by slot itself. The cluster client is typed as
`redis.asyncio.Redis` for the code that uses it: it is not a subclass, but it offers every
command the session core and the stage links call (tests/sessions/test_cluster.py runs them
on a real cluster), and the two it lacks in redis-py 7.4, classic pub/sub (`pubsub()`,
`publish()`), are added here: see `ClusterClient`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster
from redis.asyncio.connection import ConnectionPool
from redis.exceptions import ClusterDownError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger("parley.redis")

CLUSTER_PARAM = "cluster"
_YES = {"1", "yes", "true", "on"}
_NO = {"0", "no", "false", "off"}
PROBE_TIMEOUT_S = 3.0
"""How long startup waits to learn whether the server is a cluster."""


def cluster_choice(url: str) -> tuple[str, bool | None]:
    """The URL without its `cluster` parameter, and what that parameter said: True, False,
    or None (absent: ask the server). Raises ValueError for any other value."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    said = [value.lower() for name, value in query if name == CLUSTER_PARAM]
    if not said:
        return url, None
    if said[-1] not in _YES | _NO:
        raise ValueError(f"--redis-url: cluster={said[-1]!r}; use cluster=yes or cluster=no")
    rest = urlencode([(name, value) for name, value in query if name != CLUSTER_PARAM])
    return urlunsplit(parts._replace(query=rest)), said[-1] in _YES


async def open_redis(
    url: str, *, socket_timeout: float, socket_connect_timeout: float
) -> aioredis.Redis:
    """A client for `url` (see the module docstring for how a cluster is recognised)."""
    options = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    if urlsplit(url).scheme == "unix":
        return aioredis.Redis.from_url(url, **options)
    url, cluster = cluster_choice(url)
    if cluster is None:
        plain = aioredis.Redis.from_url(url, **options)
        cluster = await _is_cluster(plain, url)
        if not cluster:
            return plain
        await plain.aclose()
    if not cluster:
        return aioredis.Redis.from_url(url, **options)
    log.info("Redis at %s is a cluster: using the cluster client", _address(url))
    return cast(aioredis.Redis, ClusterClient.from_url(url, **options))


class ClusterClient(RedisCluster):  # type: ignore[misc]  # redis is untyped here (pyproject)
    """redis-py's async cluster client plus classic pub/sub, which it lacks.

    A classic PUBLISH on any node reaches the subscribers on every node of the cluster (the
    cluster bus carries it), so a subscription may sit on any one node: the client's default
    node (any startup node before the first command), on a connection of its own. PUBLISH
    answers only how many subscribers the node it went to has, so when that is 0 the
    subscribers of the channel on every node are counted (PUBSUB NUMSUB): the answer says,
    as on one server, whether anybody heard it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pubsub_pools: dict[str, ConnectionPool] = {}
        self.nodes_manager.__class__ = _NodesManager  # same slots: a safe class swap

    def pubsub(self, **kwargs: Any) -> PubSub:
        node: ClusterNode | None = self.get_default_node()
        if node is None:
            node = next(iter(self.nodes_manager.startup_nodes.values()))
        pool = self._pubsub_pools.get(node.name)
        if pool is None:
            pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
            self._pubsub_pools[node.name] = pool
        return PubSub(pool, **kwargs)

    async def publish(self, channel: str | bytes, message: str | bytes) -> int:
        here = int(await self.execute_command("PUBLISH", channel, message))
        if here:
            return here
        counts = await self.execute_command(
            "PUBSUB NUMSUB", channel, target_nodes=RedisCluster.ALL_NODES
        )
        return sum(int(count) for _channel, count in counts)

    async def ping(self) -> bool:
        """True when every primary answers and says the cluster serves (`cluster_state:ok`);
        raises ClusterDownError when one says it does not. RedisCluster's own PING asks one
        node: a probe would see a dead node's slots as reachable, and the session core
        would flap between outage and recovery."""
        states = await self.execute_command("CLUSTER INFO", target_nodes=RedisCluster.PRIMARIES)
        if "cluster_state" in states:  # one primary: its answer, not one per node
            states = {"the only primary": states}
        down = sorted(name for name, info in states.items() if info["cluster_state"] != "ok")
        if down:
            raise ClusterDownError(f"cluster_state is not ok on {', '.join(down)}")
        return True

    async def aclose(self) -> None:
        pools, self._pubsub_pools = list(self._pubsub_pools.values()), {}
        for pool in pools:
            await pool.disconnect()
        await super().aclose()
        # redis-py 7.4 skips this when the last command failed on a dead node (the client
        # is then marked to reload the slot map), leaving every node's connections open.
        await self.nodes_manager.aclose()
        await self.nodes_manager.aclose("startup_nodes")


async def _is_cluster(client: aioredis.Redis, url: str) -> bool:
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            info = await client.info("cluster")
    except (RedisError, OSError) as exc:  # TimeoutError is an OSError
        log.warning(
            "could not ask the Redis at %s whether it is a cluster (%s: %s); using a plain "
            "client (add ?%s=yes to the URL if it is a cluster)",
            _address(url),
            type(exc).__name__,
            exc,
            CLUSTER_PARAM,
        )
        return False
    return bool(int(info.get("cluster_enabled", 0)))


def _address(url: str) -> str:
    """host:port of a URL, without credentials, for log lines."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"


class _NodesManager(NodesManager):  # type: ignore[misc]  # redis is untyped here (pyproject)
    """Two fixes to redis-py 7.4's slot map loading. It reloads the map (after a node
    failed) with new node objects but keeps the old ones as the known nodes: commands then
    open connections that close() never sees, and each reload orphans more; here every slot
    maps back to the known node of its name. And when no node answers it raises
    RedisClusterException, which callers cannot tell from misuse; here a ConnectionError."""

    __slots__ = ()

    async def initialize(self) -> None:
        try:
            await super().initialize()
        except RedisClusterException as exc:
            # No node could be reached: that is an outage (a ConnectionError to callers),
            # not the client misuse RedisClusterException otherwise means.
            if isinstance(exc.__cause__, (RedisError, OSError)):
                raise RedisConnectionError(str(exc)) from exc
            raise
        manager: Any = self  # redis-py's attributes, untyped here
        known = manager.nodes_cache
        manager.slots_cache = {
            slot: [known.get(node.name, node) for node in held]
            for slot, held in manager.slots_cache.items()
        }
