"""WebRTC calls over aiortc: the offer checked and answered, the caller's tracks drained
into the session, the answer played out in real time, the data channel."""
