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
- everything else (state changes, items, audio deltas, which arrive through `audio()`)
  stays on the server.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import numpy.typing as npt

from sessions.events import (
    ErrorEvent,
    Event,
    OutputAudioTranscriptDelta,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionExpiring,
    SessionStateChanged,
)
from sessions.state import SessionState

from .sender import Message, PacedSender, SendFn
from .video_messages import (
    ErrorMessage,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseStart,
    ResponseTextDelta,
    ResponseTextDone,
    ServerMessage,
    SessionDone,
)
from .wav import wav_bytes

CLIENT_REASONS = frozenset({"client", "client_done", "client_gone"})
"""Session close reasons that need no explanation: the client ended it."""


def wav_delta(pcm: npt.NDArray[np.int16], sample_rate: int) -> Message:
    """The PacedSender's audio hook: one piece of speech as a `response.audio.delta`."""
    data = base64.b64encode(wav_bytes(pcm, sample_rate)).decode("ascii")
    return ResponseAudioDelta(data=data).wire()


class VideoStreamSink(PacedSender):
    def __init__(self, send: SendFn, *, audio_output: bool) -> None:
        super().__init__(send, wav_delta)
        self.audio_output = audio_output
        self.session_closed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._texts: dict[str, list[str]] = {}

    def send_message(self, message: ServerMessage, *, after_audio: bool = False) -> None:
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
        match event:
            case ResponseCreated():
                self._texts[event.response_id] = []
                self.send_message(ResponseStart())
            case OutputTextDelta() | OutputAudioTranscriptDelta():
                self._texts.setdefault(event.response_id, []).append(event.delta)
                self.send_message(ResponseTextDelta(delta=event.delta))
            case ResponseDone():
                self._response_done(event)
            case ErrorEvent():
                self.send_message(ErrorMessage(message=event.message, code=event.code))
            case SessionStateChanged(state=SessionState.LISTENING.value):
                self._idle.set()
            case SessionExpiring():
                self.send_message(
                    ErrorMessage(
                        message=f"The session reaches its maximum lifetime in "
                        f"{event.seconds_left} s",
                        code="session_expiring",
                    )
                )
            case SessionClosed():
                if event.reason not in CLIENT_REASONS:
                    self.send_message(
                        ErrorMessage(message=f"Session closed: {event.reason}", code=event.reason),
                        after_audio=True,
                    )
                self.send_message(SessionDone(reason=event.reason), after_audio=True)
                self._idle.set()
                self.session_closed.set()
            case _:
                pass

    def _response_done(self, event: ResponseDone) -> None:
        text = "".join(self._texts.pop(event.response_id, [])).strip()
        if event.status == "failed":
            self.send_message(
                ErrorMessage(message=event.reason or "the answer failed", code="response_failed"),
                after_audio=True,
            )
        self.send_message(ResponseTextDone(text=text, status=event.status), after_audio=True)
        if self.audio_output:
            self.send_message(ResponseAudioDone(status=event.status), after_audio=True)
