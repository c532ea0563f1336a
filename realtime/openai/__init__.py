"""OpenAI's Realtime protocol (`/v1/realtime`, `/v1/realtime/calls`): client events in,
server events out, over a WebSocket, a WebRTC call's data channel or a sideband."""
