"""SIP calls with RTP audio: a SIP user agent server in front of the session core."""
