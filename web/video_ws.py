"""`/v1/video/chat/stream`: vLLM-Omni's streaming video chat, as its clients connect to it.

Auth is the signaling's (`Authorization: Bearer <API key or ephemeral secret>`); a bad key is
refused before the upgrade with HTTP 401, and a server still starting with 503. The
connection itself is realtime.video_chat.video_stream's. Whether it starts a session or
resumes one says its first message, after the upgrade: so a key (or address) at its limits
is refused then, with an `error` message `rate_limit_exceeded` (and close 1013), not 429.
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from realtime.video_chat.video_stream import VideoChatStream

from .services import services_of
from .ws_admission import admit


async def video_chat_stream(websocket: WebSocket) -> None:
    """Authenticate, then one VideoChatStream for the connection."""
    admitted = await admit(websocket, websocket.headers.get("authorization"), new_session=False)
    if admitted is None:
        return
    grant, manager = admitted
    services = services_of(websocket)
    await websocket.accept()
    stream = VideoChatStream(
        websocket,
        manager,
        services.video_streams,
        grace_s=services.resume_grace_s,
        caller=grant.caller,
        slow=services.slow_clients,
    )
    await stream.run_connection()
