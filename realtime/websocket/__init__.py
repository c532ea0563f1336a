"""WebSocket transports: OpenAI Realtime at /v1/realtime, and the shared paced sender."""
