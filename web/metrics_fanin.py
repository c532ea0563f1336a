"""/metrics across worker processes: any process answers a scrape with every process's figures.

Behind one port (`parley serve --workers N`) a scrape reaches one process chosen by the
kernel, so each process publishes its own exposition text to Redis and a scrape answers with
all of them. They live in one hash, `parley:metrics`, a field per process (one key is one
hash slot, so a Redis Cluster serves it as well), each stamped with the time it was written.
A process rewrites its field every couple of seconds and just before it answers a scrape;
a field older than `stale_s` belongs to a process that is gone: it is left out and deleted.
The hash itself expires `stale_s` after the last write, so nothing outlives the servers.

The merged text keeps each metric family once (HELP and TYPE) with every process's samples,
each labelled `process="<process id>"`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from redis.exceptions import RedisError

log = logging.getLogger("parley.web.metrics")

KEY = "parley:metrics"
PUBLISH_S = 2.0
STALE_S = 10.0
PROCESS_LABEL = "process"


class _Families:
    """A collector that hands out families already built (the merged ones)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def merge(texts: Mapping[str, str]) -> bytes:
    """Exposition texts by process id -> one text, samples labelled with their process."""
    families: dict[str, Metric] = {}
    for process_id, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            merged.samples.extend(
                Sample(
                    sample.name,
                    {**sample.labels, PROCESS_LABEL: process_id},
                    sample.value,
                    sample.timestamp,
                    sample.exemplar,
                )
                for sample in family.samples
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class MetricsFanIn:
    """One process's side: publish its registry, and answer a scrape for every process."""

    def __init__(
        self,
        redis: aioredis.Redis,
        process_id: str,
        registry: CollectorRegistry,
        *,
        publish_s: float = PUBLISH_S,
        stale_s: float = STALE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.process_id = process_id
        self.registry = registry
        self.publish_s = publish_s
        self.stale_s = stale_s
        self._clock = clock

    def own_text(self) -> str:
        return generate_latest(self.registry).decode()

    async def publish(self) -> None:
        payload = json.dumps({"at": self._clock(), "text": self.own_text()})
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(KEY, self.process_id, payload)
            pipe.expire(KEY, math.ceil(self.stale_s))
            await pipe.execute()

    async def run(self) -> None:
        """Publish every `publish_s` until cancelled; a Redis error waits for the next tick."""
        while True:
            try:
                await self.publish()
            except (RedisError, OSError) as exc:
                log.debug("metrics not published: %s", exc)
            await asyncio.sleep(self.publish_s)

    async def withdraw(self) -> None:
        """Remove this process's figures (on shutdown)."""
        await self.redis.hdel(KEY, self.process_id)

    async def scrape(self) -> bytes:
        """Every live process's figures; this process's own alone if Redis fails."""
        try:
            await self.publish()
            entries: dict[bytes, bytes] = await self.redis.hgetall(KEY)
        except (RedisError, OSError) as exc:
            log.warning("metrics of the other processes unavailable: %s", exc)
            return merge({self.process_id: self.own_text()})
        now = self._clock()
        texts: dict[str, str] = {}
        stale: list[str] = []
        for field, raw in entries.items():
            process_id = field.decode()
            try:
                entry = json.loads(raw)
                at, text = float(entry["at"]), str(entry["text"])
            except (ValueError, KeyError, TypeError):
                stale.append(process_id)
                continue
            if now - at > self.stale_s:
                stale.append(process_id)
            else:
                texts[process_id] = text
        if stale:
            with contextlib.suppress(RedisError, OSError):  # the next scrape tries again
                await self.redis.hdel(KEY, *stale)
        texts.setdefault(self.process_id, self.own_text())
        return merge(texts)
