"""/metrics across processes: each publishes its figures to Redis, any one answers for all."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.tasks import cancel_and_wait
from tests.realtime.apps import served_app
from web.metrics_fanin import KEY, MetricsFanIn, merge
from web.settings import Settings


def _registry(sessions: float, turns: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("parley_active_sessions", "Sessions open", registry=registry).set(sessions)
    counter = Counter("parley_responses", "Responses", ["status"], registry=registry)
    counter.labels(status="completed").inc(turns)
    return registry


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_merge_labels_every_sample_and_names_each_family_once() -> None:
    text = merge(
        {
            "proc_a": _exposition(_registry(2, 5)),
            "proc_b": _exposition(_registry(1, 3)),
        }
    ).decode()
    assert text.count("# TYPE parley_active_sessions gauge") == 1
    assert text.count("# HELP parley_responses_total Responses") == 1
    assert _samples(text) == {
        ("parley_active_sessions", (("process", "proc_a"),)): 2.0,
        ("parley_active_sessions", (("process", "proc_b"),)): 1.0,
        ("parley_responses_total", (("process", "proc_a"), ("status", "completed"))): 5.0,
        ("parley_responses_total", (("process", "proc_b"), ("status", "completed"))): 3.0,
    }


def _exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


async def test_a_scrape_shows_every_live_process_and_drops_a_dead_one(
    redis: aioredis.Redis,
) -> None:
    now = [1000.0]
    a = MetricsFanIn(redis, "proc_a", _registry(2, 5), stale_s=10, clock=lambda: now[0])
    b = MetricsFanIn(redis, "proc_b", _registry(1, 3), stale_s=10, clock=lambda: now[0])
    await b.publish()
    now[0] += 5
    assert (
        _samples((await a.scrape()).decode())[("parley_active_sessions", (("process", "proc_b"),))]
        == 1.0
    )
    assert 0 < await redis.ttl(KEY) <= 10
    now[0] += 6  # b last wrote 11 s ago: gone
    text = (await a.scrape()).decode()
    assert 'process="proc_b"' not in text and 'process="proc_a"' in text
    assert await redis.hkeys(KEY) == [b"proc_a"]
    await a.withdraw()
    assert await redis.exists(KEY) == 0


async def test_a_garbled_entry_is_dropped(redis: aioredis.Redis) -> None:
    await redis.hset(KEY, "proc_x", "not json")
    await redis.hset(KEY, "proc_y", json.dumps({"at": "soon"}))
    fanin = MetricsFanIn(redis, "proc_a", _registry(0, 0))
    text = (await fanin.scrape()).decode()
    assert "proc_x" not in text and "proc_y" not in text and 'process="proc_a"' in text
    await fanin.withdraw()
    assert await redis.exists(KEY) == 0


async def test_without_redis_a_scrape_answers_its_own_figures(tmp_path: Path) -> None:
    client = aioredis.Redis.from_url(
        f"unix://{tmp_path}/nothing.sock", socket_connect_timeout=0.5, socket_timeout=0.5
    )
    try:
        fanin = MetricsFanIn(client, "proc_a", _registry(4, 0))
        text = (await fanin.scrape()).decode()
        assert 'parley_active_sessions{process="proc_a"} 4.0' in text
        runner = asyncio.create_task(fanin.run())  # errors do not end it
        await asyncio.sleep(0.05)
        assert not runner.done()
        await cancel_and_wait(runner)
    finally:
        await client.aclose()


async def test_two_worker_apps_on_one_redis_each_answer_for_both(redis_url: str) -> None:
    settings = Settings(pipeline="echo", workers=2)
    async with served_app(settings, redis_url) as one, served_app(settings, redis_url) as two:
        ids = {one.app.state.process_id, two.app.state.process_id}
        async with httpx.AsyncClient() as http:
            for served in (one, two):
                text = (await http.get(f"{served.http_url}/metrics")).text
                labelled = {
                    s.labels["process"]
                    for family in text_string_to_metric_families(text)
                    if family.name == "parley_pipeline_loaded"
                    for s in family.samples
                }
                assert labelled == ids
