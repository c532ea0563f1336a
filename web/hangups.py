"""Hang-ups on every worker: what a server process serves so that a hang-up landing on
another worker process ends its session or call here (realtime/hangup_relay.py).

Each protocol ends a relayed target exactly as its own route ends a local one: GPT-Live's
`/v1/live/sessions/{id}/hangup` (a SIP call of this process, or a live session on another
transport: `close_requested`), OpenAI Realtime's `/v1/realtime/calls/{id}/hangup` (a WebRTC
or SIP call). Nothing runs until asked: each request is handled in the mailbox's own task.
"""

from __future__ import annotations

from realtime.hangup_relay import OP, HangupRelays
from realtime.transports.webrtc.registry import CallNotFound

from .live_sip_routes import LIVE_HANGUP, hang_up_here
from .realtime_routes import CALL_HANGUP
from .services import Running, Services


def serve_hangups(services: Services, running: Running) -> None:
    """Let other workers' hang-ups end this process's sessions and calls (with Redis)."""
    if services.redis is None:
        return
    relays = HangupRelays(services.redis)
    relays.serve(LIVE_HANGUP, lambda session_id: hang_up_here(services, session_id))
    relays.serve(CALL_HANGUP, lambda call_id: _hang_up_call(running, call_id))
    running.manager.serve_requests(OP, relays.on_request)


async def _hang_up_call(running: Running, call_id: str) -> bool:
    try:
        await running.hangup(call_id)
    except CallNotFound:
        return False
    return True
