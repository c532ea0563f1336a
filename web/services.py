"""What the routes serve with: one typed object, owned by the app's lifespan.

Some of it lives as long as the app (settings, auth, metrics, the resume registries); the
session manager and the call registry exist only while the server runs, and they come and
go together. They are one `Running` value, not two optional fields: a route asks once
whether the server runs (`services.running`) and then has both, typed, with nothing left
to re-check. `services_of()` is how a route finds the app's Services.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from starlette.requests import HTTPConnection

from pipeline.capacity import PipelineCapacity
from pipeline.types import Pipeline
from realtime.auth import Authenticator
from realtime.call_index import CallIndex
from realtime.live.live_sideband import LiveSessions
from realtime.metrics import TransportMetrics
from realtime.openai.sideband import SidebandCall
from realtime.openai.websocket_accept import OpenAIConnections
from realtime.slow_clients import SlowClients
from realtime.transports.sip.media_calls import SipCallNotFound, SipMediaCalls
from realtime.transports.webrtc.registry import CallNotFound, CallRegistry
from realtime.transports.websocket.connections import DEFAULT_GRACE_S
from realtime.video_chat.video_stream import VideoStreams
from sessions import SessionManager, SessionMetrics

from .settings import Settings


@dataclass(frozen=True, slots=True)
class Running:
    """What exists while the server runs: made together by the lifespan, gone together."""

    manager: SessionManager
    calls: CallRegistry
    sip: SipMediaCalls | None = None
    """SIP calls (`--sip-port`), else None."""
    call_index: CallIndex | None = None
    """Which process holds each call, for sidebands landing on another worker."""

    def call(self, call_id: str) -> SidebandCall:
        """The live WebRTC or SIP call `call_id` (a SIP call also by the app's id in
        OpenAI's SIP flow); raises CallNotFound."""
        try:
            return self.calls.get(call_id)
        except CallNotFound:
            if self.sip is None:
                raise
        try:
            return self.sip.get(call_id)
        except SipCallNotFound:
            raise CallNotFound(call_id) from None

    def call_ids(self) -> set[str]:
        """Every id a live call here may be found by (`call`), and the app's ids of SIP
        calls ringing while it decides: the call index (realtime/call_index.py) says so in
        Redis, for sidebands and call control landing on another worker."""
        ids = set(self.calls.call_ids())
        if self.sip is not None:
            ids.update(self.sip.call_ids())
            ids.update(self.sip.app_ids())  # ringing ones too: the app decides on any worker
        return ids

    async def hangup(self, call_id: str) -> None:
        """End the WebRTC or SIP call `call_id`; raises CallNotFound."""
        try:
            await self.calls.hangup(call_id)
            return
        except CallNotFound:
            if self.sip is None:
                raise
        try:
            await self.sip.hangup(call_id)
        except SipCallNotFound:
            raise CallNotFound(call_id) from None


@dataclass
class Services:
    """What the routes need, owned by the app's lifespan."""

    settings: Settings
    redis_url: str
    metrics: SessionMetrics = field(default_factory=SessionMetrics)
    redis: aioredis.Redis | None = None
    pipeline: Pipeline | None = None
    pipeline_error: str | None = None
    pipeline_ready: bool = False
    session_cap: int | None = None
    """The sessions admitted at once across the service, once the pipeline has started:
    the smaller of --max-sessions and the pipeline's capacity (`SessionManager.hold_to`)."""
    capacity: PipelineCapacity | None = None
    """What the started pipeline says it can serve (None: it states nothing)."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by the server's stop signal; a worker stops waiting for its pipeline then."""
    running: Running | None = None
    """The session manager and the call registry; None while the server starts or stops."""
    auth: Authenticator = field(default_factory=lambda: Authenticator(None))
    websockets: OpenAIConnections = field(default_factory=OpenAIConnections)
    """OpenAI Realtime WebSocket connections by session, for resumes."""
    video_streams: VideoStreams = field(default_factory=VideoStreams)
    """Video chat streams by session, for resumes."""
    live_sessions: LiveSessions = field(default_factory=LiveSessions)
    """GPT-Live sessions this process serves, by id, for sidebands to attach to."""
    resume_grace_s: float = DEFAULT_GRACE_S
    """How long a WebSocket session outlives its dropped connection, for a resume."""
    transport_metrics: TransportMetrics = field(init=False)
    """The transports' instruments, in `metrics`' registry."""

    def __post_init__(self) -> None:
        self.transport_metrics = TransportMetrics(self.metrics.registry)

    @property
    def slow_clients(self) -> SlowClients:
        """What the transports do about a client that stops reading (`--slow-client-s`)."""
        return SlowClients(self.settings.slow_client_s, self.transport_metrics)

    @property
    def manager(self) -> SessionManager | None:
        return self.running.manager if self.running is not None else None

    @property
    def calls(self) -> CallRegistry | None:
        return self.running.calls if self.running is not None else None


def services_of(connection: HTTPConnection) -> Services:
    """The Services of the app serving `connection` (a request or a WebSocket)."""
    services: Services = connection.app.state.services
    return services
