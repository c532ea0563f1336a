"""Session events -> vLLM-Omni video chat messages, for one connection.

Assistant audio becomes small WAV deltas (`wav_delta`, the PacedSender's audio hook). The
end of an answer (`response.text.done`, `response.audio.done`) never overtakes its audio:
those messages are flagged `after_audio`.

Which events map to what:

- `response.created` -> `response.start`
- `response.output_audio_transcript.delta` / `response.output_text.delta`
  -> `response.text.delta`
- `response.done` -> `response.text.done` (the text sent as deltas, and the status),
  then `response.audio.done` when the session speaks; a failed answer says why in one
  `error` first (code `response_failed`: the session's own error about the failure,
  which comes while the answer is open, is folded into it)
- `error` -> `error`; `session.closed` -> `session.done` (after an `error` when the
  session ended by itself, e.g. on the idle timeout)
- `session.created` -> `session.created {session_id, resume_token}` (Parley's own)
- everything else (state changes, items, audio deltas, which arrive through `audio()`)
  stays on the server.

These are the full messages, Parley's extras included (ids, codes, statuses, done messages
for a cancelled answer, `session.created`); a client that did not opt in to them gets
each reshaped as vLLM-Omni's server writes it (video_wire.py).

Ids. Every message carries an `event_id`, deterministic so that a resumed connection can
replay the session's event log through a fresh `VideoMessages` and send the very ids the
client would have seen: the first message of an event takes the event's id, the others
`<id>.<n>` (as ga_events does for OpenAI clients). A message that no logged event produced
(audio, `pong`, an error about a client message) is named at send time by the connection
(connection.py): `<the last event's id>~<n>`.
"""

from __future__ import annotations

import base64

import numpy as np
import numpy.typing as npt

from sessions.errors import SessionExpiredError
from sessions.events import (
    ErrorEvent,
    Event,
    OutputAudioTranscriptDelta,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionCreated,
    SessionExpiring,
)

from ..transports.websocket.connection import with_id
from ..transports.websocket.sender import Message
from .video_messages import (
    ErrorMessage,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseStart,
    ResponseTextDelta,
    ResponseTextDone,
    ServerMessage,
    SessionCreatedMessage,
    SessionDone,
)
from .wav import wav_bytes

EXPIRY_CODES = frozenset(SessionExpiredError.codes.values())
CLIENT_REASONS = frozenset({"client", "client_done", "client_closed", "client_gone"})
"""Session close reasons that need no explanation: the client ended it."""


def wav_delta(pcm: npt.NDArray[np.int16], sample_rate: int) -> Message:
    """The PacedSender's audio hook: one piece of speech as a `response.audio.delta`."""
    data = base64.b64encode(wav_bytes(pcm, sample_rate)).decode("ascii")
    return ResponseAudioDelta(data=data).wire()


class VideoMessages:
    """Session events -> video chat messages, for one connection (it keeps the text of
    each answer so far, for `response.text.done`)."""

    def __init__(self, *, audio_output: bool) -> None:
        self.audio_output = audio_output
        self._texts: dict[str, list[str]] = {}
        self._held_error: ErrorEvent | None = None
        """A server error while an answer is open: most likely the answer's failure."""

    def expand(self, event: Event) -> list[tuple[Message, bool]]:
        """The messages for `event`, in order, each with its `after_audio` flag: an end of
        an answer never overtakes that answer's audio."""
        group: list[tuple[ServerMessage, bool]] = []
        match event:
            case SessionCreated():
                created = SessionCreatedMessage(
                    session_id=event.session_id, resume_token=event.resume_token
                )
                group.append((created, False))
            case ResponseCreated():
                self._texts[event.response_id] = []
                group.append((ResponseStart(), False))
            case OutputTextDelta() | OutputAudioTranscriptDelta():
                self._texts.setdefault(event.response_id, []).append(event.delta)
                group.append((ResponseTextDelta(delta=event.delta), False))
            case ResponseDone():
                group.extend(self._response_done(event))
            case ErrorEvent() if event.code in EXPIRY_CODES:
                pass  # the session's own end: its SessionClosed says why, in this API's words
            case ErrorEvent() if self._texts and event.error_type == "server_error":
                self._held_error = event
            case ErrorEvent():
                group.append((ErrorMessage(message=event.message, code=event.code), False))
            case SessionExpiring():
                expiring = ErrorMessage(
                    message=f"The session reaches its maximum lifetime in {event.seconds_left} s",
                    code="session_expiring",
                )
                group.append((expiring, False))
            case SessionClosed():
                if event.reason not in CLIENT_REASONS:
                    why = ErrorMessage(message=f"Session closed: {event.reason}", code=event.reason)
                    group.append((why, True))
                group.append((SessionDone(reason=event.reason), True))
            case _:
                pass
        return [
            (with_id(message.wire(), event.event_id if n == 0 else f"{event.event_id}.{n}"), after)
            for n, (message, after) in enumerate(group)
        ]

    def _response_done(self, event: ResponseDone) -> list[tuple[ServerMessage, bool]]:
        text = "".join(self._texts.pop(event.response_id, [])).strip()
        held, self._held_error = self._held_error, None
        group: list[tuple[ServerMessage, bool]] = []
        if event.status == "failed":
            reason = event.reason or (held.message if held else "") or "the answer failed"
            group.append((ErrorMessage(message=reason, code="response_failed"), True))
        elif held is not None:  # not about this answer after all: told now
            group.append((ErrorMessage(message=held.message, code=held.code), True))
        group.append((ResponseTextDone(text=text, status=event.status), True))
        if self.audio_output:
            group.append((ResponseAudioDone(status=event.status), True))
        return group
