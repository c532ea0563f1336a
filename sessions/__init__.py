"""The session core: one conversation's state, turns, responses and buffers, in Redis.

What it offers the transports (`realtime`, `web`), all importable from `sessions` itself:
- `SessionManager` admits and finds sessions (Redis leases); a `Session` is one
  conversation: audio in, turn detection, responses from the pipeline, history, the event
  stream a transport forwards, and the output it plays (`PlayoutSink` over a
  `PlayoutBuffer`); `SessionState` is its state machine's states.
- `SessionConfig` (validated settings), `ResponseOptions` (what one response.create
  asks beyond them), `ConversationItem` (an item of the conversation), and the errors a
  client can be told (`ParleyError` and its kinds).
- `EventLog` and `event_to_dict` / `event_from_dict`: the event log a resume replays.
- `Clock`: the time a session's limits and a response's timeouts run on (`RealClock` in a
  server; tests compress time with `ScaledClock`).
- The event vocabulary itself is the module `sessions.events`.
Transport rules (wire formats, connections, resume) stay in `realtime`; audio formats are
`pipeline.audio_format`'s.
"""

from .clock import REAL_CLOCK, Clock, RealClock, ScaledClock
from .config import MaxFrames, NumFrames, SessionConfig, ToolConfig, TurnDetectionConfig, Unit
from .errors import (
    ConfigError,
    InvalidRequestError,
    MediaError,
    ParleyError,
    SessionClosedError,
    SessionLimitError,
    SessionNotFoundError,
)
from .event_log import EventLog
from .events import ConversationItem
from .manager import DEFAULT_MAX_SESSIONS, SessionManager
from .metrics import SessionMetrics
from .playout import PlayoutBuffer, PlayoutSink
from .records import event_from_dict, event_to_dict
from .resample import MAX_APPEND_BYTES
from .response_options import ResponseOptions
from .session import Session
from .state import SessionState
from .turns import MIN_COMMIT_MS

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "REAL_CLOCK",
    "MAX_APPEND_BYTES",
    "MIN_COMMIT_MS",
    "Clock",
    "ConfigError",
    "ConversationItem",
    "EventLog",
    "InvalidRequestError",
    "MaxFrames",
    "MediaError",
    "NumFrames",
    "ParleyError",
    "PlayoutBuffer",
    "PlayoutSink",
    "RealClock",
    "ResponseOptions",
    "ScaledClock",
    "Session",
    "SessionClosedError",
    "SessionConfig",
    "SessionLimitError",
    "SessionManager",
    "ToolConfig",
    "SessionMetrics",
    "SessionNotFoundError",
    "SessionState",
    "TurnDetectionConfig",
    "Unit",
    "event_from_dict",
    "event_to_dict",
]
