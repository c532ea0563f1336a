"""Client events -> Session calls, one connection's worth.

A transport parses each message (`parse_client_event`) and hands it here, in the order it
arrived. Nothing a client sends can end the connection: every failure, whether the
session refuses (a ParleyError) or the event makes no sense (a ProtocolError), becomes an
`error` event pointing at the client's `event_id`, and the session goes on. With an
`error_limit`, a burst of such errors is throttled (realtime.error_throttle): at most that
many a second, the rest summarised in one `errors_suppressed` error; the transport calls
`close()` when the connection ends.

The dispatcher is a small class because a connection has state the session does not:
its audio formats (base64 PCM at some rate, or G.711, is a wire matter) and how to clear
its playout.

Decisions, following OpenAI where it has one:

- `input_audio_buffer.append` carries at most 1 MiB of PCM16 (`MAX_APPEND_BYTES`; 512 KiB
  of G.711, which decodes to twice that); a larger one is an `audio_too_large` error
  that says the limit, and the connection goes on.
- `input_audio_buffer.append` over WebRTC is an error: the microphone travels on the
  audio track, and two inputs into one buffer would interleave. `session.update` audio
  formats are ignored over WebRTC (the SDP negotiates the codecs), so they never lower
  the session's output rate.
- `output_audio_buffer.clear` calls the transport's `clear_output`; a transport without
  playout of its own (WebSocket: the client plays the audio) gets an error.
- `conversation.item.create` takes messages (user, system, assistant), function calls and
  function call outputs (client_items.py). The client's item `id` is kept and
  `previous_item_id` places the item (`root`: at the start). Images go to the frame cache
  first (so the next answer sees them); an image-only user message adds frames and
  creates no item. A user message with `input_audio` is a committed turn of that audio.
  A transcription session refuses it, as `response.create`, with an error naming the event
  (sessions/transcription_session.py).
- `session.update` applies what it can: each value Parley cannot use (an unknown turn
  detection type, a setting out of range, G.711 where the transport has no codec) is an
  `error` naming its field, and the rest of the update still applies, as
  `session.updated` shows. Every field of OpenAI's session object has its fate
  (session_fields.py); a key it does not have is an `unknown_parameter` error, and so is a
  conversation's field in a transcription session (OpenAI's transcription session has none).
- `response.create` takes OpenAI's per-response options (response_spec.py); a bad one
  fails that response.create with an error naming it. `response.cancel` with nothing in
  progress is the error OpenAI sends, `response_cancel_not_active`.
- `conversation.item.retrieve` and `.delete` work on any item of the conversation.
- Every error sent is logged (INFO: the client's mistake, not the server's), with its code
  and the client's event id, so an operator can see what a client was told.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol, assert_never

from sessions import MAX_APPEND_BYTES, ConfigError, ParleyError, Session
from sessions.transcription_session import refuse_item

from ..error_throttle import ErrorThrottle, summary_text
from .client_events import (
    G711_RATE,
    AudioFormats,
    ClientEvent,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    OutputAudioBufferClear,
    ProtocolError,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    parse_client_event,
    partial_session_patch,
)
from .client_items import client_item
from .response_spec import response_options

log = logging.getLogger("parley.realtime.dispatch")

_MAX_REFUSED_SETTINGS = 16
"""Settings one session.update may have refused before the rest applies (bounds retries)."""

Transport = Literal["webrtc", "websocket"]


class G711Codec(Protocol):
    """G.711 <-> PCM16 at 8 kHz; the transport's, which encodes the output with it too."""

    def decode(self, payload: bytes, fmt: str) -> bytes:
        """`audio/pcmu` or `audio/pcma` bytes -> PCM16 mono at 8 kHz."""
        ...


class ClientEventDispatcher:
    def __init__(
        self,
        session: Session,
        *,
        transport: Transport,
        clear_output: Callable[[], None] | None = None,
        g711: G711Codec | None = None,
        error_limit: int | None = None,
    ) -> None:
        self.session = session
        self.transport = transport
        self.formats = AudioFormats.for_config(session.config)
        """The connection's audio formats; pass them to `to_wire(formats=...)`."""
        self._clear_output = clear_output
        self._g711 = g711
        self.errors: ErrorThrottle | None = None
        """The throttle on error events (with an `error_limit`), for its counts."""
        if error_limit is not None:
            self.errors = ErrorThrottle(self._summarise, limit=error_limit)

    def close(self) -> None:
        """The connection is ending: no summary of throttled errors goes out. Idempotent."""
        if self.errors is not None:
            self.errors.close()

    async def handle_raw(self, raw: str | bytes) -> None:
        """Parse and perform one message; a malformed one becomes an error event."""
        try:
            event = parse_client_event(raw)
        except ProtocolError as exc:
            self.report(exc, exc.event_id)
            return
        await self.handle(event)

    async def handle(self, event: ClientEvent) -> None:
        """Perform `event` on the session; failures become error events, never raise."""
        try:
            await self._perform(event)
        except ParleyError as exc:
            self.report(exc, event.event_id)
        except Exception:
            log.exception("session %s: %s failed", self.session.session_id, event.type)
            failure = ParleyError(f"{event.type} failed on the server; the session goes on")
            self.report(failure, event.event_id)

    def report(self, error: ParleyError, client_event_id: str | None) -> None:
        """Send `error` about the client's event `client_event_id`, within the error budget."""
        if self.session.closed:
            return
        if self.errors is None or self.errors.admit(error.code, str(error)):
            log.info(
                "session %s: error %s sent for client event %s: %s",
                self.session.session_id,
                error.code,
                client_event_id,
                error,
            )
            self.session.report_error(error, client_event_id)

    def _summarise(self, count: int, first: str) -> None:
        if self.session.closed or self.errors is None:
            return
        text = summary_text(count, first, self.errors.limit, self.errors.window_s)
        self.session.report_error(ProtocolError("errors_suppressed", text))

    async def _perform(self, event: ClientEvent) -> None:
        session = self.session
        match event:
            case SessionUpdate():
                await self._update(event)
            case InputAudioBufferAppend():
                await self._append(event)
            case InputAudioBufferCommit():
                await session.commit_audio()
            case InputAudioBufferClear():
                await session.clear_audio()
            case ConversationItemCreate():
                await self._create_item(event)
            case ConversationItemTruncate():
                if event.content_index != 0:
                    raise ProtocolError(
                        "invalid_value",
                        "Parley's items have one content part: content_index must be 0",
                        param="content_index",
                    )
                await session.truncate_item(event.item_id, event.audio_end_ms)
            case ConversationItemDelete():
                await session.delete_item(event.item_id)
            case ConversationItemRetrieve():
                await session.retrieve_item(event.item_id)
            case ResponseCreate():
                await session.create_response(response_options(event.response, event.event_id))
            case ResponseCancel():
                if not await session.cancel_response():
                    raise ProtocolError(
                        "response_cancel_not_active", "there is no response in progress to cancel"
                    )
            case OutputAudioBufferClear():
                if self._clear_output is None:
                    raise ProtocolError(
                        "unsupported",
                        "output_audio_buffer.clear is for WebRTC; over a WebSocket the client "
                        "plays the audio and clears it itself",
                    )
                self._clear_output()
            case _:
                assert_never(event)

    async def _update(self, event: SessionUpdate) -> None:
        """Apply what can be applied; each value that cannot is its own `error` (naming
        the field), sent before `session.updated` shows what took effect."""
        eid = event.event_id
        transcribing = self.session.config.type == "transcription"
        patch, formats, errors = partial_session_patch(event, self.formats, transcribing)
        if event.session.type == "realtime" and self.session.config.type == "transcription":
            errors.append(
                ProtocolError(
                    "invalid_value",
                    "a transcription session cannot become a realtime session",
                    eid,
                    "session.type",
                )
            )
        if self.transport == "webrtc":
            patch.pop("output_sample_rate", None)
            formats = self.formats
        elif formats.uses_g711 and self._g711 is None:
            errors.append(
                ProtocolError(
                    "unsupported",
                    "G.711 (audio/pcmu, audio/pcma) is not available on this connection; "
                    "use audio/pcm",
                    eid,
                    param="session.audio",
                )
            )
            formats = self.formats
            patch.pop("output_sample_rate", None)
        vad = patch.get("turn_detection")
        if (
            isinstance(vad, dict)
            and "type" not in vad
            and self.session.config.turn_detection is None
        ):
            errors.append(
                ProtocolError(
                    "invalid_value",
                    "parley.min_speech_ms needs voice activity turn detection, which is "
                    "off; set session.audio.input.turn_detection too",
                    eid,
                    param="session.parley.min_speech_ms",
                )
            )
            del patch["turn_detection"]
        for error in errors:
            self.report(error, eid)
        # The new formats are in place before session.updated goes out, so the transport
        # renders the effective ones; a refused update puts the old ones back.
        previous, self.formats = self.formats, formats
        try:
            await self._apply(patch, eid)
        except BaseException:
            self.formats = previous
            raise

    async def _apply(self, patch: dict[str, Any], eid: str | None) -> None:
        """session.update(patch), leaving out each setting the session refuses as out of
        range (its ConfigError names it, and goes to the client) until the rest applies."""
        for _ in range(_MAX_REFUSED_SETTINGS):
            try:
                await self.session.update(patch)
                return
            except ConfigError as exc:
                smaller = _without(patch, exc.field)
                if smaller == patch:
                    raise
                self.report(exc, eid)
                patch = smaller
        await self.session.update(patch)

    async def _append(self, event: InputAudioBufferAppend) -> None:
        if self.transport == "webrtc":
            raise ProtocolError(
                "unsupported",
                "input_audio_buffer.append is not used over WebRTC: the microphone audio "
                "travels on the call's audio track",
            )
        payload, fmt = event.pcm(), self.formats.input
        if len(payload) > (limit := self._append_limit()):
            seconds = limit / (2 * self.formats.input_rate if fmt == "audio/pcm" else G711_RATE)
            size = "1 MiB" if limit == 1 << 20 else f"{limit // 1024} KiB"
            raise ProtocolError(
                "audio_too_large",
                f"input_audio_buffer.append: the audio is {len(payload):,} bytes; the limit "
                f"is {limit:,} bytes ({size}, {seconds:.1f} s of {fmt}) per append: send it "
                "in smaller appends",
                event.event_id,
                param="audio",
            )
        if fmt == "audio/pcm":
            await self.session.append_audio(payload, self.formats.input_rate, 1)
            return
        assert self._g711 is not None  # checked when the format was set
        await self.session.append_audio(self._g711.decode(payload, fmt), G711_RATE, 1)

    def _append_limit(self) -> int:
        """The most audio bytes one append may carry: 1 MiB of PCM16 once decoded."""
        return MAX_APPEND_BYTES if self.formats.input == "audio/pcm" else MAX_APPEND_BYTES // 2

    async def _create_item(self, event: ConversationItemCreate) -> None:
        refuse_item(self.session.config)
        made = client_item(event.item, event.event_id)
        previous = event.previous_item_id
        if previous == "root":
            previous = ""
        for image in made.images:
            await self.session.add_frame(image)
        if made.item is None:
            return
        if made.audio is None:
            await self.session.add_item(made.item, previous)
            return
        if previous is not None:
            raise ProtocolError(
                "unsupported",
                "an input_audio message joins the conversation at its end: leave out "
                "previous_item_id",
                event.event_id,
                "previous_item_id",
            )
        pcm, rate = made.audio, self.formats.input_rate
        if self.formats.input != "audio/pcm":
            assert self._g711 is not None  # checked when the format was set
            pcm, rate = self._g711.decode(pcm, self.formats.input), G711_RATE
        await self.session.add_audio_item(made.item, pcm, rate)


def _without(patch: dict[str, Any], field: str) -> dict[str, Any]:
    """`patch` less the setting at dotted `field` (`turn_detection.threshold`)."""
    head, _, rest = field.partition(".")
    if head not in patch:
        return patch
    out = dict(patch)
    inner = out[head]
    if rest and isinstance(inner, dict):
        smaller = _without(inner, rest)
        if smaller is inner:
            del out[head]
        else:
            out[head] = smaller
    else:
        del out[head]
    return out
