"""The session's output sink for one video chat stream.

Session events become vLLM-Omni video chat messages, and assistant audio becomes small WAV
deltas, all through the PacedSender's one ordered queue (so a client hears the answer at
the pace it is spoken and an interrupted answer stops within one piece). The end of an
answer (`response.text.done`, `response.audio.done`) never overtakes its audio.

Which events map to what:

- `response.created` -> `response.start`
- `response.output_audio_transcript.delta` / `response.output_text.delta`
  -> `response.text.delta`
- `response.done` -> `response.text.done` (the text sent as deltas, and the status),
  then `response.audio.done` when the session speaks; a failed answer says why in an
  `error` first
- `error` -> `error`; `session.closed` -> `session.done` (after an `error` when the
  session ended by itself, e.g. on the idle timeout)
- `session.created` -> `session.created {session_id, resume_token}` (Parley's own)
- everything else (state changes, items, audio deltas, which arrive through `audio()`)
  stays on the server.

Ids. Every message carries an `event_id`, deterministic so that a resumed connection can
replay the session's event log through a fresh `VideoMessages` and send the very ids the
client would have seen: the first message of an event takes the event's id, the others
`<id>.<n>` (as ga_events does for OpenAI clients). A message that no logged event produced
(audio, `pong`, an error about a client message) is named at send time, after the last
event's message sent before it: `<that id>~<n>`.

Resume: `hold()` before the session is attached, then `catch_up()` sends what the client
missed, straight to the socket, before the sender starts; live events that came meanwhile
follow, each exactly once.
"""

from __future__ import annotations

import asyncio
import base64
import collections

import numpy as np
import numpy.typing as npt

from sessions.event_log import EventLog
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
    SessionStateChanged,
)
from sessions.state import SessionState

from .resume import HELD_EVENTS, read_log, replay_messages
from .sender import Message, PacedSender, SendFn
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

CLIENT_REASONS = frozenset({"client", "client_done", "client_closed", "client_gone"})
"""Session close reasons that need no explanation: the client ended it."""


def wav_delta(pcm: npt.NDArray[np.int16], sample_rate: int) -> Message:
    """The PacedSender's audio hook: one piece of speech as a `response.audio.delta`."""
    data = base64.b64encode(wav_bytes(pcm, sample_rate)).decode("ascii")
    return ResponseAudioDelta(data=data).wire()


def with_id(message: ServerMessage | Message, event_id: str) -> Message:
    """The wire form of `message` with its `event_id` (after its type)."""
    body = message.wire() if isinstance(message, ServerMessage) else dict(message)
    out: Message = {"type": body.pop("type"), "event_id": event_id}
    out.update(body)
    return out


class VideoMessages:
    """Session events -> video chat messages, for one connection (it keeps the text of
    each answer so far, for `response.text.done`)."""

    def __init__(self, *, audio_output: bool) -> None:
        self.audio_output = audio_output
        self._texts: dict[str, list[str]] = {}

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
            (with_id(message, event.event_id if n == 0 else f"{event.event_id}.{n}"), after)
            for n, (message, after) in enumerate(group)
        ]

    def messages(self, event: Event) -> list[Message]:
        """`expand` without the flags: what a replay sends."""
        return [message for message, _ in self.expand(event)]

    def _response_done(self, event: ResponseDone) -> list[tuple[ServerMessage, bool]]:
        text = "".join(self._texts.pop(event.response_id, [])).strip()
        group: list[tuple[ServerMessage, bool]] = []
        if event.status == "failed":
            reason = event.reason or "the answer failed"
            group.append((ErrorMessage(message=reason, code="response_failed"), True))
        group.append((ResponseTextDone(text=text, status=event.status), True))
        if self.audio_output:
            group.append((ResponseAudioDone(status=event.status), True))
        return group


class VideoStreamSink(PacedSender):
    def __init__(self, send: SendFn, *, audio_output: bool) -> None:
        super().__init__(send, wav_delta)
        self.messages = VideoMessages(audio_output=audio_output)
        self.session_closed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._held: collections.deque[Event] | None = None

    @property
    def audio_output(self) -> bool:
        return self.messages.audio_output

    def send_message(self, message: ServerMessage, *, after_audio: bool = False) -> None:
        """Queue a message of the connection's own (no session event behind it)."""
        self.post(message.wire(), after_audio=after_audio)

    # --- the answer in progress ----------------------------------------------------------

    def expect_response(self) -> None:
        """A query has just started an answer: `idle()` waits for it to end."""
        self._idle.clear()

    async def idle(self) -> None:
        """Return once no answer is running: generated, played out, back to listening."""
        await self._idle.wait()

    # --- OutputSink ----------------------------------------------------------------------

    def event(self, event: Event) -> None:
        if self._held is not None:
            self._held.append(event)
        else:
            self._emit(event)

    def _emit(self, event: Event, *, replayed: bool = False) -> None:
        """Queue the event's messages (unless a replay sent them already), and note what
        it says about the answer and the session."""
        if not replayed:
            for message, after_audio in self.messages.expand(event):
                self.post(message, after_audio=after_audio)
        match event:
            case SessionStateChanged(state=SessionState.LISTENING.value):
                self._idle.set()
            case SessionClosed():
                self._idle.set()
                self.session_closed.set()
            case _:
                pass

    # --- resume --------------------------------------------------------------------------

    def hold(self) -> None:
        """Hold live events until `catch_up()` has sent the missed ones."""
        self._held = collections.deque(maxlen=HELD_EVENTS)

    async def catch_up(
        self, event_log: EventLog, session_id: str, last_event_id: str | None
    ) -> None:
        """Send what the client missed after `last_event_id` straight to the socket (call
        this before `run()`), then queue the live events held meanwhile. Raises what a
        send raises when the client has gone again."""
        bodies = await read_log(event_log, session_id)
        if bodies is None:
            unreadable = ErrorMessage(
                message="The missed messages could not be read", code="resume_failed"
            )
            await self._send(unreadable.wire())
            bodies = []
        replay = replay_messages(bodies, self.messages.messages, last_event_id)
        if not replay.found:
            gap = ErrorMessage(
                message=f"Event {last_event_id} is no longer in the session's log; every "
                "message still logged follows (drop those you have by event_id)",
                code="resume_gap",
            )
            await self._send(gap.wire())
        for message in replay.missed:
            await self._send(message)
        held, self._held = self._held or (), None
        for event in held:
            self._emit(event, replayed=event.event_id in replay.logged_ids)
