"""`parley serve`: the embedded default in one command.

Order matters. The private redis-server is started first, on the main thread (its
parent-death signal is tied to this thread), then the app runs under uvicorn. SIGINT or
SIGTERM stops accepting, closes every session with a goodbye event (the app's lifespan),
stops Redis, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Generator, Sequence

import uvicorn

from pipeline.remote import serve_remote_stage
from realtime.ice import is_loopback

from .app import create_app
from .redis_server import EmbeddedRedis, RedisServerMissing
from .settings import Settings, SettingsError, parse_settings

log = logging.getLogger("parley")
GRACEFUL_SHUTDOWN_S = 5
WS_MAX_SIZE = 16 * 1024 * 1024
"""OpenAI Realtime's message limit: a bigger WebSocket message closes with 1009."""


class _Server(uvicorn.Server):
    """uvicorn, but a signal ends the process with status 0 after a clean shutdown.

    uvicorn re-raises a captured SIGTERM once it has shut down, which makes the process die
    by that signal; we have already shut down in order, so we exit normally instead.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def _announce_when_listening(server: uvicorn.Server, settings: Settings) -> None:
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
        await asyncio.sleep(0.05)
    print(f"Parley is ready: open {settings.base_url}", flush=True)


async def _serve(settings: Settings, redis_url: str) -> None:
    app = create_app(settings, redis_url)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ws_max_size=WS_MAX_SIZE,
    )
    server = _Server(config)
    announce = asyncio.create_task(_announce_when_listening(server, settings))
    try:
        await server.serve()
    finally:
        announce.cancel()
        await asyncio.wait({announce})
    if not server.started:
        raise SystemExit(1)


def serve(settings: Settings) -> int:
    if settings.api_key is None and not is_loopback(settings.host):
        print(
            f"parley: refusing to listen on {settings.host} without an API key: "
            "set --api-key (or PARLEY_API_KEY), or listen on 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    embedded: EmbeddedRedis | None = None
    redis_url = settings.redis_url
    if redis_url is None:
        embedded = EmbeddedRedis()
        try:
            embedded.start()
        except RedisServerMissing as exc:
            print(f"parley: {exc}", file=sys.stderr)
            return 2
        redis_url = embedded.url
        log.info("embedded redis-server (pid %s) at %s", embedded.pid, redis_url)
    try:
        asyncio.run(_serve(settings, redis_url))
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        if embedded is not None:
            embedded.stop()
            log.info("embedded redis-server stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        command, settings = parse_settings(argv)
    except SettingsError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return 2
    if command == "serve":
        return serve(settings)
    if command == "stage":
        return serve_stage(settings)
    return 2


def serve_stage(settings: Settings) -> int:
    """Serve one stage for a main process elsewhere, until it closes the link or Ctrl-C."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    assert settings.redis_url is not None and settings.stage is not None
    try:
        asyncio.run(serve_remote_stage(settings.pipeline, settings.stage, settings.redis_url))
    except KeyboardInterrupt:
        pass
    except (LookupError, ValueError) as exc:
        print(f"parley: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
