"""`parley stage`: the other host's side of a remote stage (`remote.py` is the main side).

It loads the graph file, checks the devices the stage is placed on, and serves the stage's
engine over the Redis-stream link the graph names, saying `Alive` every `HEARTBEAT_S` and
riding out Redis outages. It lives apart from `remote.py` because it needs the registry
(the graph's stages and links), and the registry builds `RemoteEngine`s: one module holding
both would import the registry and be imported by it.
"""

from __future__ import annotations

import logging

from .connectors.redis_streams import RedisStreamLink
from .devices import check_devices
from .graph_config import load_graph
from .registry import graph_path, link_name, worker_spec
from .remote import HEARTBEAT_S, link_redis
from .worker_main import serve_stage

log = logging.getLogger("parley.pipeline.remote")


async def serve_remote_stage(graph_file: str, stage: str, redis_url: str) -> None:
    """`parley stage`: serve one stage of a graph for a main process on another host."""
    path = graph_path(graph_file)
    config = load_graph(path)
    check_devices(config, str(path), only=stage)
    spec = worker_spec(config, stage)
    redis = await link_redis(redis_url)
    try:
        link = RedisStreamLink.end(redis, link_name(config, stage), "b")
        log.info("serving stage %s of %s on link %s", stage, config.name, link_name(config, stage))
        await serve_stage(spec, link, heartbeat_s=HEARTBEAT_S, ride_outages=True)
    finally:
        await redis.aclose()
