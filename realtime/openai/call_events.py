"""A call's server events: the GA sequence on the data channel, and the call's listeners.

The session emits its events to the call (its one output sink). Here they become what an
OpenAI Realtime client reads, through a GAExpander as on the WebSocket (output items,
content parts, `*.done`, transcription `usage`), so both transports send one sequence.
Audio deltas are left out: the audio is on the media track. The call's own playout news
(`output_audio_buffer.started` / `.stopped` / `.cleared`) goes in, but only once a
response exists: the event's `response_id` is required (OpenAI's SDK refuses a null one),
and audio with no response behind it has no id to give.

The data channel gets every message, in order: held until it opens (the oldest dropped
past `PENDING_EVENTS`), and dropped, counted, while more than `MAX_CHANNEL_BUFFER` is
unsent (a peer that stopped reading). `stalled_s()` says how long its unsent bytes have
not gone down (aiortc hands the next message to SCTP only once the peer has taken the
last): the call hangs up on a peer stalled for the slow-client bound (call.py).
Listeners (sideband WebSockets, `?call_id=`) get the session's events and the playout
news from the moment they attach, and map them with expanders of their own; when the
call ends each is told once. A listener that fails is detached (and told the call has
ended for it): the call and its data channel go on.

A re-attached call (a new peer connection for a session whose old one dropped:
registry.py) holds the session's live events (`hold`) until `catch_up` has sent what the
client missed after its `last_event_id`: the session's event log run through this call's
fresh expander, as a WebSocket resume does (websocket/resume.py), then the held events
the log did not cover. The playout news has no session event behind it: it is named
after the last message sent before it, `<that id>~<n>`, so a client's last `event_id`,
whatever it was, is a place to re-attach from.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from sessions.events import Event, ResponseCreated

from .ga_events import GAExpander
from .resume import HELD_EVENTS, replay_messages
from .server_events import output_audio_buffer_event, to_wire

if TYPE_CHECKING:  # annotations only: sideband WebSockets import this without aiortc
    from aiortc import RTCDataChannel

log = logging.getLogger("parley.realtime.webrtc")

Message = dict[str, Any]
PlayoutNews = Literal["started", "stopped", "cleared"]

PENDING_EVENTS = 512
"""Events held until the data channel opens (session.created comes first)."""
MAX_CHANNEL_BUFFER = 4 * 1024 * 1024
SENT_POLL_S = 0.01


class CallListener(Protocol):
    """A second reader of a call's events (a sideband connection). Neither method may block."""

    def event(self, event: Event) -> None:
        """One session event, as the call got it."""

    def post(self, message: Message, *, after_audio: bool = False) -> None:
        """One message of the call's own (its playout news), JSON-ready."""

    def call_ended(self, reason: str) -> None:
        """The call has ended (hang-up, the peer gone, the session closed)."""


class CallEvents:
    def __init__(self) -> None:
        self.expander = GAExpander()
        self.dropped = 0
        """Messages the data channel did not get (never open in time, or not reading)."""
        self.ended = False
        self._channel: RTCDataChannel | None = None
        self._pending: collections.deque[str] = collections.deque(maxlen=PENDING_EVENTS)
        self._listeners: list[CallListener] = []
        self._response_id: str | None = None
        self._stall: tuple[float, int] | None = None
        """(since when, the unsent bytes last seen) while the channel's backlog has not
        gone down."""
        self._held: collections.deque[Event] | None = None
        """Live session events waiting for a re-attach's catch-up."""
        self._last_id = "evt"
        """The last event id sent that a session event gave (`evt` until there is one)."""
        self._seq = 0

    def open(self, channel: RTCDataChannel) -> None:
        """The `oai-events` channel: what waited goes out once it is open."""
        self._channel = channel
        if channel.readyState == "open":
            self._flush_pending()
        else:
            channel.on("open", self._flush_pending)

    def stalled_s(self, now: float) -> float:
        """How long the data channel has had unsent bytes without sending any of them: 0
        while it is closed, empty, or sending."""
        channel = self._channel
        unsent = channel.bufferedAmount if channel is not None else 0
        if unsent == 0 or channel is None or channel.readyState != "open":
            self._stall = None
            return 0.0
        if self._stall is None or unsent < self._stall[1]:
            self._stall = (now, unsent)  # some went out: a stall starts from here
            return 0.0
        since = self._stall[0]
        self._stall = (since, unsent)
        return now - since

    def session_event(self, event: Event, *, extra_events: bool) -> None:
        if self._held is not None:
            self._held.append(event)
            return
        self._tell(lambda listener: listener.event(event))
        for message in self._expand(event, extra_events):
            self._send(message)

    def _expand(self, event: Event, extra_events: bool) -> list[Message]:
        """The data channel's messages of a session event (its state updated)."""
        if isinstance(event, ResponseCreated):
            self._response_id = event.response_id
        wire = to_wire(event, audio="omit", extra_events=extra_events)
        return self.expander.expand(event, wire) if wire is not None else []

    # --- re-attaching --------------------------------------------------------------------

    def hold(self) -> None:
        """Hold live session events until `catch_up` (a re-attached call)."""
        self._held = collections.deque(maxlen=HELD_EVENTS)

    def catch_up(
        self, logged: list[dict[str, Any]] | None, last_event_id: str | None, *, extra_events: bool
    ) -> None:
        """Send what the client missed after `last_event_id` (`logged`: the session's
        event log; None when it could not be read), then the events held meanwhile that
        the log did not hold yet. A client whose event is no longer logged gets a
        `resume_gap` error, then everything logged."""
        if logged is None:
            self._send(self._own(_error("resume_failed", "the missed events could not be read")))
            logged = []
        replay = replay_messages(logged, lambda e: self._expand(e, extra_events), last_event_id)
        if not replay.found:
            text = (
                f"event {last_event_id} is no longer in the session's log; every event "
                "still logged follows (drop those you have by event_id)"
            )
            self._send(self._own(_error("resume_gap", text)))
        for message in replay.missed:
            self._send(message)
        held, self._held = self._held or collections.deque(), None
        for event in held:
            if event.event_id not in replay.logged_ids:
                self.session_event(event, extra_events=extra_events)

    def playout(self, news: PlayoutNews) -> None:
        """`output_audio_buffer.<news>` about the latest response's audio."""
        if self._response_id is None or self._held is not None:
            return
        message = self._own(output_audio_buffer_event(news, self._response_id))
        self._tell(lambda listener: listener.post(message))
        self._send(message)

    def _own(self, message: Message) -> Message:
        """A message of the call's own, named after the last event's message sent."""
        self._seq += 1
        return {**message, "event_id": f"{self._last_id}~{self._seq}"}

    # --- listeners -----------------------------------------------------------------------

    def listen(self, listener: CallListener) -> bool:
        """Give `listener` the call's events from now on; False once the call has ended."""
        if self.ended:
            return False
        self._listeners.append(listener)
        return True

    def unlisten(self, listener: CallListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    def _tell(self, what: Callable[[CallListener], None]) -> None:
        for listener in list(self._listeners):
            try:
                what(listener)
            except Exception:
                log.exception("a call listener failed; detaching it")
                self.unlisten(listener)
                listener.call_ended("server_error")

    def end(self, reason: str) -> None:
        """The call has ended: each listener is told, once. Idempotent."""
        if self.ended:
            return
        self.ended = True
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.call_ended(reason)

    # --- the data channel ----------------------------------------------------------------

    def send(self, message: Message) -> None:
        """One message on the data channel, in order (held until it opens)."""
        self._send(message)

    async def sent(self, within_s: float) -> None:
        """Wait (up to `within_s`) until the channel has handed everything to SCTP: a
        goodbye before the peer connection closes."""
        async with asyncio.timeout(within_s):
            while (channel := self._channel) is not None and channel.readyState == "open":
                if not self._pending and channel.bufferedAmount == 0:
                    return
                await asyncio.sleep(SENT_POLL_S)

    def _send(self, message: Message) -> None:
        event_id = message.get("event_id")
        if isinstance(event_id, str) and "~" not in event_id:
            self._last_id, self._seq = event_id, 0
        text = json.dumps(message, separators=(",", ":"))
        channel = self._channel
        if channel is None or channel.readyState != "open":
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1
            self._pending.append(text)
            return
        if channel.bufferedAmount > MAX_CHANNEL_BUFFER:
            self.dropped += 1
            return
        channel.send(text)

    def _flush_pending(self) -> None:
        channel = self._channel
        while self._pending and channel is not None and channel.readyState == "open":
            channel.send(self._pending.popleft())


def _error(code: str, text: str) -> Message:
    """An `error` of the call's own (about a re-attach's catch-up)."""
    return {
        "type": "error",
        "error": {"type": "server_error", "code": code, "message": text, "param": None},
    }
