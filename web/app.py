"""The Starlette app: health, readiness, metrics and the page, around one SessionManager.

The lifespan owns the process-wide resources, in order: the Redis client, the pipeline,
the session manager. Shutdown closes them in reverse: every session gets its goodbye
event first, then the pipeline stops, then Redis is let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import redis.asyncio as aioredis
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pipeline.connectors.redis_client import open_redis
from pipeline.metrics import PipelineMetrics
from pipeline.registry import load_pipeline
from pipeline.tasks import TaskSet, background, cancel_and_wait
from pipeline.types import Pipeline, ReportsStages
from realtime.auth import Authenticator
from realtime.call_index import CallIndex
from realtime.live.live_store import StoredSessions
from realtime.transports.webrtc.ice import IceSettings, parse_ice_servers
from realtime.transports.webrtc.registry import CallRegistry
from sessions import SessionManager
from sessions.process_beat import new_process_id
from sessions.redis_link import WRITE_PROBE_KEY

from .audio_rest import ROUTES as AUDIO_ROUTES
from .broken_stages import exit_when_broken
from .call_controls import serve_call_controls
from .metrics_fanin import MetricsFanIn
from .origins import OriginAllowlist, OriginPolicy
from .realtime_routes import ROUTES as REALTIME_ROUTES
from .services import Running, Services, services_of

__all__ = ["Services", "create_app"]
from .settings import Settings
from .sidebands import serve_sidebands
from .sip_service import sip_service

log = logging.getLogger("parley.web")
STATIC = Path(__file__).parent / "static"
READY_TIMEOUT_S = 1.0
DRAIN_POLL_S = 0.1


async def _start_pipeline(services: Services, pipeline: Pipeline, manager: SessionManager) -> None:
    """Load the models in the background: /healthz answers meanwhile, /readyz says so. Once
    loaded, admission is held to what the pipeline says it can serve (across every server
    process of `--workers N`)."""
    try:
        await pipeline.start()
    except Exception as exc:  # readiness reports it; the process stays up for /healthz
        services.pipeline_error = f"pipeline {services.settings.pipeline!r} failed to start: {exc}"
        log.error("%s", services.pipeline_error)
        return
    services.capacity = pipeline.capacity()
    services.session_cap = manager.hold_to(services.capacity, max(1, services.settings.workers))
    services.pipeline_ready = True
    log.info("pipeline %s is ready", services.settings.pipeline)


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    services: Services = app.state.services
    services.redis = await open_redis(
        services.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0
    )
    settings = services.settings  # GPT-Live's stored sessions (realtime/live/live_store.py)
    services.live_sessions.stored = StoredSessions(
        services.redis, int(settings.live_store_retention_s), settings.live_recording_max_s
    )
    try:
        async with _published_metrics(app, services.redis), _serving(app, services):
            yield
    finally:
        await services.redis.aclose()


@contextlib.asynccontextmanager
async def _published_metrics(app: Starlette, redis: aioredis.Redis) -> AsyncIterator[None]:
    """With workers, this process's figures go to Redis for every process's /metrics."""
    services: Services = app.state.services
    if services.settings.workers <= 1:
        yield
        return
    fanin = MetricsFanIn(redis, app.state.process_id, services.metrics.registry)
    publisher = background(fanin.run(), "metrics:publish")
    app.state.metrics_fanin = fanin
    try:
        yield
    finally:
        app.state.metrics_fanin = None
        await cancel_and_wait(publisher)
        with contextlib.suppress(Exception):  # Redis may be gone; the entry then goes stale
            await fanin.withdraw()


@contextlib.asynccontextmanager
async def _serving(app: Starlette, services: Services) -> AsyncIterator[None]:
    """The pipeline, the session manager and the calls, yielding once while they serve."""
    assert services.redis is not None
    try:
        services.pipeline = load_pipeline(
            services.settings.pipeline,
            PipelineMetrics(services.metrics.registry),
            redis_url=services.redis_url,
            shared=dict(services.settings.shared_stages),
        )
    except Exception as exc:
        services.pipeline_error = f"pipeline {services.settings.pipeline!r}: {exc}"
        log.error("%s", services.pipeline_error)
    try:
        if services.pipeline is None:
            yield
            return
        manager = SessionManager(
            services.redis,
            services.pipeline,
            max_sessions=services.settings.max_sessions,
            limits=services.settings.session_limits(),
            key_limits=services.settings.key_limits,
            metrics=services.metrics,
            process_id=app.state.process_id,
        )
        # Tasks the lifespan owns, not a TaskGroup: the loader must run across the `yield`,
        # which a TaskGroup in an async generator cannot span.
        loading = TaskSet("pipeline-start")
        loader = loading.create_task(_start_pipeline(services, services.pipeline, manager))
        loading.create_task(exit_when_broken(services.pipeline), name="pipeline-broken")
        if services.settings.workers > 1:
            # A worker listens only once it can serve: its socket joins the shared port's
            # group at uvicorn's start, after this, and until then the others get them all.
            # A stop while it loads ends the wait (uvicorn checks for it only after this).
            stopping = loading.create_task(services.stopping.wait())
            await asyncio.wait({loader, stopping}, return_when=asyncio.FIRST_COMPLETED)
            await cancel_and_wait(stopping)
        try:
            async with manager:
                calls = CallRegistry(
                    manager,
                    _ice_settings(services.settings),
                    services.transport_metrics,
                    slow=services.slow_clients,
                )
                try:
                    async with contextlib.AsyncExitStack() as stack:
                        sip = None
                        index = CallIndex(services.redis, manager.process_id)
                        if services.settings.sip_port is not None:
                            sip = await stack.enter_async_context(
                                sip_service(
                                    services.settings,
                                    manager,
                                    app.state,
                                    services.live_sessions,
                                    index,
                                )
                            )
                        running = Running(manager, calls, sip.calls if sip else None, index)
                        await stack.enter_async_context(serve_sidebands(services, running))
                        serve_call_controls(services, running, app)
                        services.running = running
                        yield
                        if services.settings.workers > 1:
                            await _drain(services, running)
                        log.info("shutting down: closing %d session(s)", len(manager))
                finally:
                    await calls.close()
                    services.running = None
        finally:
            services.running = None
            await loading.close()
    finally:
        if services.pipeline is not None:
            await services.pipeline.close()


async def _drain(services: Services, running: Running) -> None:
    """A worker's SIGTERM, after uvicorn closed its listener (new connections go to the
    other workers) and its WebSockets (1012: clients reconnect and resume elsewhere): the
    WebSocket sessions are handed over (kept in Redis for a resume on another process),
    calls go on until they end or `--drain-s` passes; whatever is left is then closed."""
    loop = asyncio.get_running_loop()
    drain_s = services.settings.drain_s
    deadline = loop.time() + drain_s
    moved = await running.manager.hand_over_all()  # and it admits nothing more
    if moved:
        log.info("draining: %d WebSocket session(s) handed over", moved)
    live = len(running.calls) + (len(running.sip) if running.sip is not None else 0)
    if live:
        log.info("draining: %d call(s) may go on for up to %gs", live, drain_s)
    while live and loop.time() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
        live = len(running.calls) + (len(running.sip) if running.sip is not None else 0)


def _ice_settings(settings: Settings) -> IceSettings:
    addresses = [a.strip() for a in settings.ice_host_addresses.split(",") if a.strip()]
    return IceSettings.for_listen_host(
        settings.host, parse_ice_servers(settings.ice_servers), addresses
    )


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    services = services_of(request)
    reasons: list[str] = []
    down: dict[str, str] = {}
    if services.redis is None:
        reasons.append("redis: not connected yet")
    else:
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await services.redis.ping()
                # At its memory limit Redis answers PING but refuses writes (OOM), and a
                # new session with it: a write that writes nothing tells (redis_link.py).
                await services.redis.set(WRITE_PROBE_KEY, b"", xx=True)
        except Exception as exc:
            services.metrics.redis_errors.inc()
            reasons.append(f"redis: {type(exc).__name__}: {exc}".rstrip(": "))
    if services.pipeline_error:
        reasons.append(services.pipeline_error)
    elif not services.pipeline_ready:
        reasons.append(f"pipeline {services.settings.pipeline!r}: still loading")
    elif isinstance(services.pipeline, ReportsStages):
        down = services.pipeline.stalled_stages()  # a stage hung, or its process restarting
        reasons.extend(f"stage {stage}: {why}" for stage, why in down.items())
    if reasons:
        body: dict[str, object] = {"status": "unavailable", "reasons": reasons}
        if down:
            body["down_stages"] = down
        return JSONResponse(body, status_code=503)
    manager = services.running.manager if services.running is not None else None
    ready: dict[str, object] = {
        "status": "ready",
        "pipeline": services.settings.pipeline,
        "sessions": len(manager) if manager else 0,
        "max_sessions": services.session_cap or services.settings.max_sessions,
    }
    if services.capacity is not None:
        ready["capacity"] = {
            "sessions": services.capacity.across(max(1, services.settings.workers)),
            "stages": services.capacity.lines(),
        }
    return JSONResponse(ready)


async def metrics(request: Request) -> Response:
    """This process's figures; with workers, every process's, each labelled `process`."""
    fanin: MetricsFanIn | None = request.app.state.metrics_fanin
    if fanin is not None:
        return Response(await fanin.scrape(), media_type=CONTENT_TYPE_LATEST)
    services = services_of(request)
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html")


def create_app(settings: Settings, redis_url: str) -> Starlette:
    services = Services(
        settings=settings,
        redis_url=redis_url,
        auth=Authenticator(settings.api_key),
        resume_grace_s=settings.resume_grace_s,
    )
    ready = Gauge(
        "parley_pipeline_loaded",
        "1 when the pipeline is loaded",
        registry=services.metrics.registry,
    )
    ready.set_function(lambda: 1.0 if services.pipeline_ready else 0.0)
    cap = Gauge(
        "parley_session_cap",
        "Sessions admitted at once across the service: the smaller of --max-sessions and "
        "what the pipeline says it can serve",
        registry=services.metrics.registry,
    )
    cap.set_function(lambda: float(services.session_cap or settings.max_sessions))
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            *REALTIME_ROUTES,
            *AUDIO_ROUTES,
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[Middleware(OriginPolicy, allowlist=OriginAllowlist.from_settings(settings))],
        lifespan=_lifespan,
    )
    app.state.services = services
    app.state.process_id = new_process_id()  # the session manager's, and /metrics' label
    app.state.metrics_fanin = None
    return app
