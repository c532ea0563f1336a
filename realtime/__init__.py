"""The wire side, by two axes: each protocol in one home, each transport in one home.

Protocols (what the messages mean): `openai/` (OpenAI Realtime: its client and server
events, the dispatch of client events to a session, the GA event sequence, resume, the
sideband, and its bindings to a WebSocket and to a call's data channel), `live/` (GPT-Live,
over a WebSocket, a WebRTC call or a SIP call), `video_chat/` (vLLM-Omni's streaming video
chat over a WebSocket) and `twilio/` (Twilio Media Streams over a WebSocket).

Transports (how the bytes travel): `transports/websocket/` (one connection's lifecycle,
the bounded paced sender, refusing an upgrade), `transports/webrtc/` (calls over aiortc:
the offer, the tracks, the data channel) and `transports/sip/` (a SIP user agent server
and RTP). A protocol's binding to a transport is a module in the protocol's home
(`openai/websocket.py`, `live/live_webrtc_call.py`, ...).

Shared by all: `auth` (who may start a call), `g711`, `error_throttle`, `slow_clients`,
`session_call` (what every call bound to a session has), `metrics`, and the relays that
reach the worker process owning a session or call (`request_relay`, `sideband_relay`,
with `call_index`). It builds on `sessions`; the HTTP routes that expose it live in `web`.
"""
