"""redis-py 7.4's async Redis Cluster client, made to serve where the session core expects
a `redis.asyncio.Redis`: what it lacks (classic pub/sub, for the process mailboxes) and what
it gets wrong after a node fails (a ping that asks one node, connections it leaks, an
exception that hides an outage), each fixed in one place and tested on a real cluster
(tests/sessions/test_cluster.py). `redis_client.open_redis` decides when it is used.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster
from redis.asyncio.connection import ConnectionPool
from redis.exceptions import ClusterDownError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError


class ClusterClient(RedisCluster):  # type: ignore[misc]  # redis is untyped here (pyproject)
    """redis-py's async cluster client, with classic pub/sub (which it lacks), a ping that
    means "every slot is served", and a close that closes.

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

    async def reset_connections(self) -> None:
        """Drop every node's connections and load the slot map afresh at the next command
        (the pub/sub connections stay). For an outage that outlasts its nodes' return: a
        client can be left wedged by a node's death (see sessions/redis_link.py)."""
        self._initialize = True
        await self.nodes_manager.aclose()
        await self.nodes_manager.aclose("startup_nodes")

    async def aclose(self) -> None:
        pools, self._pubsub_pools = list(self._pubsub_pools.values()), {}
        for pool in pools:
            await pool.disconnect()
        await super().aclose()
        # redis-py 7.4 skips this when the last command failed on a dead node (the client
        # is then marked to reload the slot map), leaving every node's connections open.
        await self.nodes_manager.aclose()
        await self.nodes_manager.aclose("startup_nodes")


class _NodesManager(NodesManager):  # type: ignore[misc]  # redis is untyped here (pyproject)
    """Two fixes to redis-py 7.4's slot map loading. It reloads the map (after a node
    failed) with new node objects but keeps the old ones as the known nodes: commands then
    open connections that close() never sees, and each reload orphans more; here every slot
    maps back to the known node of its name. And when no node answers it raises
    RedisClusterException, which callers cannot tell from misuse; here a ConnectionError (no
    node answered) or a ClusterDownError (the answers leave slots unserved)."""

    __slots__ = ()

    async def initialize(self) -> None:
        try:
            await super().initialize()
        except RedisClusterException as exc:
            # No node could be reached: that is an outage (a ConnectionError to callers),
            # not the client misuse RedisClusterException otherwise means.
            if isinstance(exc.__cause__, (RedisError, OSError)):
                raise RedisConnectionError(str(exc)) from exc
            # Raised without a cause, it is the answers' verdict: the nodes leave slots
            # unserved or disagree on who serves them (a node failing, or rejoining after a
            # restart). The cluster is down for now.
            if exc.__cause__ is None:
                raise ClusterDownError(str(exc)) from exc
            raise
        manager: Any = self  # redis-py's attributes, untyped here
        known = manager.nodes_cache
        manager.slots_cache = {
            slot: [known.get(node.name, node) for node in held]
            for slot, held in manager.slots_cache.items()
        }
