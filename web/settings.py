"""Server settings from the command line, each with a `PARLEY_<NAME>` environment fallback."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.registry import DEFAULT_PIPELINE
from realtime.auth import parse_keys
from realtime.slow_clients import DEFAULT_STALL_S
from realtime.transports.sip.allow import Allowlist, is_loopback
from realtime.transports.sip.call_gate import SipApi
from realtime.transports.websocket.connections import DEFAULT_GRACE_S
from sessions import DEFAULT_MAX_SESSIONS
from sessions.key_limits import KeyLimits
from sessions.session import SessionLimits

from .event_loop import LOOPS, LoopUnavailable, loop_factory
from .origin_names import ANY_ORIGIN, normalize_origin

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class SettingsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    redis_url: str | None = None
    """None: start a private redis-server (the embedded default)."""
    pipeline: str = DEFAULT_PIPELINE
    max_sessions: int = DEFAULT_MAX_SESSIONS
    idle_timeout_s: float = 60.0
    """`--idle-timeout-s`: close a session after this long with nothing from its client and
    no answer generating or playing (counted from the end of the last answer); 0: never."""
    max_session_minutes: float = 60.0
    """`--max-session-minutes`: the longest a session lasts (OpenAI's: 60); its client is
    warned a minute before (`session.expiring`) and told at the end (`session_expired`)."""
    log_level: str = "info"
    stage: str | None = None
    """`parley stage`: which stage of the pipeline to serve for another host."""
    max_sessions_per_key: int | None = None
    """`--max-sessions-per-key`: sessions one API key (or, with no key, one client address)
    may hold at once, across every process; None: no limit of its own (the cap's)."""
    sessions_per_minute_per_key: int = 0
    """`--sessions-per-minute-per-key`: sessions one key may start per minute (that many at
    once, then evenly); 0: no rate limit."""
    api_key: str | None = None
    """Required on every signaling request when set (one key, or several separated by
    commas, each with its own per-key limits); without it only loopback is served."""
    ice_servers: str = ""
    """`stun:host:port,turn:user:pass@host:port`; empty: host candidates only."""
    ice_host_addresses: str = ""
    """Comma list of addresses to gather host candidates on; empty: automatic."""
    allowed_origins: tuple[str, ...] = ()
    """Origins of other web pages that may use the server (`*`: any, with an API key only);
    its own origin and clients that send no Origin are always allowed."""
    sip_port: int | None = None
    """`--sip-port`: SIP calls (UDP and TCP) on this port of `host`; None: no SIP."""
    sip_auth: tuple[str, str] | None = None
    """`--sip-auth user:pass`: digest authentication of every INVITE."""
    sip_allow: str = ""
    """`--sip-allow CIDR,...`: the only sources whose SIP requests are answered."""
    sip_webhook: str | None = None
    """`--sip-webhook URL`: OpenAI's SIP call flow (a signed `realtime.call.incoming`,
    then the app accepts, rejects or refers); None: calls are answered at once."""
    sip_webhook_secret: str = ""
    """The webhooks' signing secret (`whsec_...`; PARLEY_SIP_WEBHOOK_SECRET)."""
    sip_api: SipApi = "realtime"
    """`--sip-api realtime|live`: which OpenAI API the webhook's calls are for: Realtime
    (`realtime.call.incoming`, `/v1/realtime/calls/{call_id}/accept`...) or GPT-Live
    (`live.transport.incoming`, `/v1/live/sessions/{session_id}/accept`...). One per
    deployment, as an OpenAI project's webhook subscribes to one of the two events."""
    workers: int = 1
    """`--workers N|auto`: server processes behind one port (SO_REUSEPORT); 1: this process."""
    drain_s: float = 30.0
    """`--drain-s`: with workers, how long a SIGTERM lets WebRTC and SIP calls go on."""
    slow_client_s: float = DEFAULT_STALL_S
    """`--slow-client-s`: how long a client may leave the server's output unread (a write
    blocked, its outbound queue full) before it is closed (1008) and its session ends."""
    resume_grace_s: float = DEFAULT_GRACE_S
    """`--resume-grace-s`: how long a session outlives its dropped connection (a WebSocket,
    a WebRTC call's peer connection) for the client to resume or re-attach it."""
    live_store_retention_s: float = 86_400.0
    """`--live-store-retention-s`: how long a GPT-Live session with `store: true` is kept
    after it ends, for forks and its recording (realtime/live/live_store.py)."""
    live_recording_max_s: float = 600.0
    """`--live-recording-max-s`: a stored GPT-Live session's recording holds at most this
    much of each side (16 kHz stereo PCM16: 64 KB a second)."""
    event_loop: str = "auto"
    """`--loop auto|uvloop|asyncio`: the event loop (auto: uvloop where installed)."""
    worker_index: int | None = None
    """Set only in a worker process started by `parley serve --workers N` (hidden flag)."""
    worker_ready_fd: int | None = None
    """The pipe on which a worker tells its parent it is ready (hidden flag)."""
    stage_hosts: bool = True
    """`--stage-hosts on|off`: with workers, load each worker-placed stage once for all of
    them (on), or once per worker (off: N copies, but a stage's crash stays in one worker)."""
    shared_stages: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(stage, unix sockets: one per replica) of each stage the parent hosts once for every
    worker (hidden flag, JSON)."""

    def session_limits(self) -> SessionLimits:
        return SessionLimits(
            idle_timeout_s=self.idle_timeout_s, max_lifetime_s=self.max_session_minutes * 60
        )

    @property
    def key_limits(self) -> KeyLimits:
        """What one API key (or address) may hold and start (sessions/key_limits.py)."""
        return KeyLimits(self.max_sessions_per_key, self.sessions_per_minute_per_key)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}/"


def _env(name: str, default: str | None) -> str | None:
    return os.environ.get(f"PARLEY_{name.upper()}", default)


def _int(name: str, value: str, lo: int, hi: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise SettingsError(
            f"--{name.replace('_', '-')}: {value!r} is not a whole number"
        ) from None
    if not lo <= number <= hi:
        raise SettingsError(
            f"--{name.replace('_', '-')}: must be between {lo} and {hi}, got {number}"
        )
    return number


def _on_off(name: str, value: str) -> bool:
    if value not in ("on", "off"):
        raise SettingsError(f"--{name.replace('_', '-')}: on or off, got {value!r}")
    return value == "on"


def _workers(value: str) -> int:
    if str(value).strip().lower() == "auto":
        return os.cpu_count() or 1
    return _int("workers", value, 1, 1024)


def _number(name: str, value: str, lo: float, hi: float) -> float:
    flag = f"--{name.replace('_', '-')}"
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"{flag}: {value!r} is not a number") from None
    if not lo <= number <= hi:
        raise SettingsError(f"{flag}: must be between {lo:g} and {hi:g}, got {number:g}")
    return number


def _drain_s(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise SettingsError(f"--drain-s: {value!r} is not a number of seconds") from None
    if not 0 <= seconds <= 3600:
        raise SettingsError(f"--drain-s: must be between 0 and 3600, got {seconds:g}")
    return seconds


def _loop(value: str) -> str:
    if value not in LOOPS:
        raise SettingsError(f"--loop: must be one of {', '.join(LOOPS)}, got {value!r}")
    if value == "uvloop":
        try:
            loop_factory(value)
        except LoopUnavailable as exc:
            raise SettingsError(str(exc)) from None
    return value


def _origins(value: str, api_key: str | None) -> tuple[str, ...]:
    origins = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        if item == ANY_ORIGIN:
            if api_key is None:
                raise SettingsError(
                    "--allowed-origins: '*' needs --api-key (without a key it would let "
                    "every web page the user opens start sessions)"
                )
            origins.append(item)
            continue
        try:
            origins.append(normalize_origin(item))
        except ValueError as exc:
            raise SettingsError(f"--allowed-origins: {exc}") from None
    return tuple(dict.fromkeys(origins))


MODEL_PATH_HELP = (
    "a checkpoint directory (Hugging Face layout) for the model engines (qwen3_omni); "
    "also PARLEY_MODEL_PATH; without it they use seeded random weights"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="parley", description="Parley realtime voice sessions")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server (every option also reads PARLEY_<NAME>)")
    d = Settings()
    serve.add_argument("--host", default=_env("host", d.host))
    serve.add_argument("--port", default=_env("port", str(d.port)))
    serve.add_argument(
        "--redis-url",
        default=_env("redis_url", None),
        help="use this Redis/Valkey; without it a private redis-server is started",
    )
    serve.add_argument("--pipeline", default=_env("pipeline", d.pipeline))
    serve.add_argument("--model-path", default=None, help=MODEL_PATH_HELP)
    serve.add_argument("--max-sessions", default=_env("max_sessions", str(d.max_sessions)))
    serve.add_argument(
        "--idle-timeout-s",
        default=_env("idle_timeout_s", f"{d.idle_timeout_s:g}"),
        help="close a session after this many seconds with nothing from its client and no "
        "answer generating or playing; 0: never",
    )
    serve.add_argument(
        "--max-session-minutes",
        default=_env("max_session_minutes", f"{d.max_session_minutes:g}"),
        help="the longest a session lasts (warned a minute before, told at the end)",
    )
    serve.add_argument(
        "--max-sessions-per-key",
        default=_env("max_sessions_per_key", ""),
        help="sessions one API key (with no key: one client address) may hold at once, "
        "across every process; off by default (only --max-sessions counts)",
    )
    serve.add_argument(
        "--sessions-per-minute-per-key",
        default=_env("sessions_per_minute_per_key", str(d.sessions_per_minute_per_key)),
        help="sessions one API key (or address) may start per minute (that many at once, "
        "then evenly); 0 (the default): no rate limit",
    )
    serve.add_argument("--log-level", default=_env("log_level", d.log_level))
    serve.add_argument(
        "--api-key",
        default=_env("api_key", None),
        help="the key every request needs (Authorization: Bearer), or several separated by "
        "commas, one per client, each with its own limits; without one only loopback is served",
    )
    serve.add_argument("--ice-servers", default=_env("ice_servers", ""))
    serve.add_argument("--ice-host-addresses", default=_env("ice_host_addresses", ""))
    serve.add_argument(
        "--allowed-origins",
        default=_env("allowed_origins", ""),
        help="comma list of scheme://host[:port] whose web pages may use the server, "
        "or * (needs --api-key); its own origin is always allowed",
    )
    serve.add_argument(
        "--sip-port",
        default=_env("sip_port", None),
        help="answer SIP calls (UDP and TCP) on this port; off unless set",
    )
    serve.add_argument(
        "--sip-auth", default=_env("sip_auth", None), help="user:pass, digest auth of INVITEs"
    )
    serve.add_argument(
        "--sip-allow", default=_env("sip_allow", ""), help="comma list of CIDRs allowed to call"
    )
    serve.add_argument(
        "--sip-webhook",
        default=_env("sip_webhook", None),
        help="URL for OpenAI's realtime.call.incoming webhook; calls then wait for "
        "POST /v1/realtime/calls/{call_id}/accept",
    )
    serve.add_argument(
        "--sip-webhook-secret",
        default=_env("sip_webhook_secret", ""),
        help="the webhook signing secret (whsec_...)",
    )
    serve.add_argument(
        "--sip-api",
        default=_env("sip_api", d.sip_api),
        choices=("realtime", "live"),
        help="with --sip-webhook: announce calls to a Realtime app (realtime.call.incoming) "
        "or a GPT-Live app (live.transport.incoming)",
    )
    serve.add_argument(
        "--workers",
        default=_env("workers", str(d.workers)),
        help="server processes behind the one port (SO_REUSEPORT), or auto (one per core); "
        "with more than one, SIP (--sip-port) is served by the first worker only",
    )
    serve.add_argument(
        "--drain-s",
        default=_env("drain_s", f"{d.drain_s:g}"),
        help="with --workers: on SIGTERM a worker stops taking sessions, closes its "
        "WebSockets (clients resume elsewhere) and lets calls go on this long",
    )
    serve.add_argument(
        "--slow-client-s",
        default=_env("slow_client_s", f"{d.slow_client_s:g}"),
        help="close a client that leaves the server's output unread this long (a WebSocket "
        "with 1008 client_too_slow, a WebRTC data channel with the call); its session ends",
    )
    serve.add_argument(
        "--resume-grace-s",
        default=_env("resume_grace_s", f"{d.resume_grace_s:g}"),
        help="how long a session outlives its dropped connection, for the client to resume "
        "it (a WebSocket) or re-attach it (a WebRTC call) with its resume token; 0: never",
    )
    serve.add_argument(
        "--live-store-retention-s",
        default=_env("live_store_retention_s", f"{d.live_store_retention_s:g}"),
        help="keep a GPT-Live session with store: true this long after it ends (forks, "
        "its recording)",
    )
    serve.add_argument(
        "--live-recording-max-s",
        default=_env("live_recording_max_s", f"{d.live_recording_max_s:g}"),
        help="a stored GPT-Live session's recording keeps at most this many seconds",
    )
    serve.add_argument(
        "--loop",
        default=_env("loop", d.event_loop),
        help="the event loop: auto (uvloop where installed), uvloop or asyncio",
    )
    serve.add_argument(
        "--stage-hosts",
        default=_env("stage_hosts", "on"),
        help="with --workers: on (each stage the graph places in a worker process is loaded "
        "once and shared by every worker) or off (each worker loads its own)",
    )
    serve.add_argument("--worker-index", default=None, help=argparse.SUPPRESS)
    serve.add_argument("--worker-ready-fd", default=None, help=argparse.SUPPRESS)
    serve.add_argument("--shared-stages", default=None, help=argparse.SUPPRESS)
    stage = sub.add_parser(
        "stage", help="serve one stage of a pipeline for a `parley serve` on another host"
    )
    stage.add_argument("--redis-url", default=_env("redis_url", None), required=False)
    stage.add_argument("--pipeline", default=_env("pipeline", d.pipeline))
    stage.add_argument("--stage", default=_env("stage", None))
    stage.add_argument("--model-path", default=None, help=MODEL_PATH_HELP)
    stage.add_argument("--log-level", default=_env("log_level", d.log_level))
    return p


def parse_settings(argv: Sequence[str] | None = None) -> tuple[str, Settings]:
    """(command, settings); raises SettingsError with a message for people."""
    args = parser().parse_args(argv)
    if args.model_path:
        if not os.path.isdir(args.model_path):
            raise SettingsError(f"--model-path: {args.model_path!r} is not a directory")
        # read by the model engines, here and in the stage workers (which inherit it)
        os.environ["PARLEY_MODEL_PATH"] = args.model_path
    level = str(args.log_level).lower()
    if level not in LOG_LEVELS:
        raise SettingsError(f"--log-level: must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if args.command == "stage":
        if not args.redis_url:
            raise SettingsError("--redis-url: a remote stage needs the Redis its server uses")
        if not args.stage:
            raise SettingsError("--stage: name the stage to serve")
        return args.command, Settings(
            redis_url=args.redis_url, pipeline=args.pipeline, stage=args.stage, log_level=level
        )
    api_key = ",".join(parse_keys(args.api_key)) or None  # "," alone is no key
    return args.command, Settings(
        host=args.host,
        port=_int("port", args.port, 0, 65535),
        redis_url=args.redis_url or None,
        pipeline=args.pipeline,
        max_sessions=_int("max_sessions", args.max_sessions, 1, 100_000),
        idle_timeout_s=_number("idle_timeout_s", args.idle_timeout_s, 0, 86_400),
        max_session_minutes=_number("max_session_minutes", args.max_session_minutes, 0.1, 1440),
        max_sessions_per_key=(
            _int("max_sessions_per_key", args.max_sessions_per_key, 1, 100_000)
            if args.max_sessions_per_key
            else None
        ),
        sessions_per_minute_per_key=_int(
            "sessions_per_minute_per_key", args.sessions_per_minute_per_key, 0, 1_000_000
        ),
        log_level=level,
        api_key=api_key,
        ice_servers=args.ice_servers,
        ice_host_addresses=args.ice_host_addresses,
        allowed_origins=_origins(args.allowed_origins, api_key),
        workers=_workers(args.workers),
        drain_s=_drain_s(args.drain_s),
        slow_client_s=_number("slow_client_s", args.slow_client_s, 0.1, 600),
        resume_grace_s=_number("resume_grace_s", args.resume_grace_s, 0, 3600),
        live_store_retention_s=_number(
            "live_store_retention_s", args.live_store_retention_s, 1, 30 * 86_400
        ),
        live_recording_max_s=_number("live_recording_max_s", args.live_recording_max_s, 0, 7200),
        event_loop=_loop(args.loop),
        worker_index=None if args.worker_index is None else int(args.worker_index),
        worker_ready_fd=None if args.worker_ready_fd is None else int(args.worker_ready_fd),
        stage_hosts=_on_off("stage_hosts", args.stage_hosts),
        shared_stages=_shared_stages(args.shared_stages),
        **_sip(args),
    )


def _sip(args: argparse.Namespace) -> dict[str, Any]:
    """The SIP settings, checked: a port, `user:pass`, CIDRs, and a webhook with its secret."""
    if args.sip_port in (None, ""):
        for flag in ("sip_auth", "sip_allow", "sip_webhook"):
            if getattr(args, flag):
                raise SettingsError(f"--{flag.replace('_', '-')} needs --sip-port")
        if args.sip_api != "realtime":
            raise SettingsError("--sip-api needs --sip-port")
        return {}
    auth = None
    if args.sip_auth:
        user, colon, password = str(args.sip_auth).partition(":")
        if not colon or not user or not password:
            raise SettingsError("--sip-auth: must be user:pass")
        auth = (user, password)
    if args.sip_allow:
        try:
            Allowlist.parse(args.sip_allow)
        except ValueError as exc:
            raise SettingsError(f"--sip-allow: {exc}") from None
    if auth is None and not args.sip_allow and not is_loopback(args.host):
        raise SettingsError(
            f"--sip-port on {args.host}: needs --sip-auth or --sip-allow (without either, "
            "SIP is served on loopback only, like HTTP without --api-key)"
        )
    webhook = args.sip_webhook or None
    if webhook is not None:
        if not webhook.startswith(("http://", "https://")):
            raise SettingsError("--sip-webhook: must be an http:// or https:// URL")
        if not args.sip_webhook_secret:
            raise SettingsError("--sip-webhook needs --sip-webhook-secret (whsec_...)")
    if args.sip_api not in ("realtime", "live"):
        raise SettingsError(f"--sip-api: realtime or live, not {args.sip_api!r}")
    if args.sip_api == "live" and webhook is None:
        raise SettingsError("--sip-api live needs --sip-webhook (a GPT-Live app accepts calls)")
    return {
        "sip_port": _int("sip_port", str(args.sip_port), 0, 65535),
        "sip_auth": auth,
        "sip_allow": args.sip_allow,
        "sip_webhook": webhook,
        "sip_webhook_secret": args.sip_webhook_secret,
        "sip_api": args.sip_api,
    }


def _shared_stages(flag: str | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The hidden --shared-stages JSON: per stage, its host's socket, or one per replica."""
    if not flag:
        return ()
    found: dict[str, str | list[str]] = json.loads(flag)
    return tuple(
        (stage, (paths,) if isinstance(paths, str) else tuple(paths))
        for stage, paths in found.items()
    )
