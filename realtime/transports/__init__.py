"""How a session's media and messages travel: a WebSocket, a WebRTC call, a SIP call with
RTP. No protocol's meaning lives here: each protocol's home binds it to a transport."""
