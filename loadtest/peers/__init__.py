"""Peer comparison: FastRTC and Pipecat bots and Parley behind one aiortc client."""
