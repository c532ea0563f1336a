"""The wire side: OpenAI Realtime (WebRTC and WebSocket) and the video chat stream.

`client_events` / `server_events` map OpenAI Realtime's JSON to and from the session's
events, and `dispatch` applies client events to a session; `webrtc/` (calls over aiortc,
their audio tracks and data channel) and `websocket/` (the two WebSocket protocols, paced
sending, resume) are the transports; `auth`, `sdp`, `ice`, `g711` and `error_throttle` serve
them. It builds on `sessions`; the HTTP routes that expose it live in `web`.
"""
