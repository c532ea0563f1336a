"""The WebSocket transport every WebSocket protocol shares: one connection's lifecycle,
the paced, bounded sender, the connections of a process by session, refusing an upgrade."""
