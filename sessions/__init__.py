"""The session core: one conversation's state, turns, responses and buffers, in Redis.

What it offers the transports (`realtime`, `web`):
- `manager.SessionManager` admits and finds sessions (Redis leases); `session.Session` is
  one conversation: audio in, turn detection, responses from the pipeline, history, the
  event stream a transport forwards (`events`), and the output it plays (`sink.OutputSink`).
- `config` (validated session settings), `errors` (what a client can be told), `state`
  (the session's state machine), `playout` and `resample` (the audio a transport plays).
- Redis-backed parts: `audio_buffer`, `frame_cache`, `history`, `event_log`, `store`,
  `records`, with `redis_link` / `spill` riding out a Redis outage.
Transport rules (wire formats, connections, resume) stay in `realtime`.
"""
