"""`/v1/twilio/media`: a Twilio Media Stream, bound to a session of its own
(realtime.twilio.twilio_accept says who may open one and how)."""

from __future__ import annotations

from starlette.websockets import WebSocket

from realtime.twilio.twilio_accept import serve_twilio

from .services import services_of


async def twilio_media(websocket: WebSocket) -> None:
    services = services_of(websocket)
    await serve_twilio(websocket, services.auth, services.manager, services.slow_clients)
