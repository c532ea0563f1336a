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
on a real cluster), with what redis-py 7.4's lacks or gets wrong added in redis_cluster.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from .redis_cluster import ClusterClient

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
