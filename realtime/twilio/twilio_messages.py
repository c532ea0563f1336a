"""Twilio Media Streams' WebSocket messages, as Twilio documents them for bidirectional
streams (`<Connect><Stream>`).

From the caller (Twilio): `connected` (protocol, version), `start` (streamSid, and under
`start`: accountSid, callSid, tracks, customParameters, mediaFormat: audio/x-mulaw, 8000
Hz, 1 channel), `media` (track, chunk, timestamp, payload: base64 mu-law, 20 ms), `mark`
(mark.name, echoed once the audio before it has played), `dtmf` (dtmf.track, dtmf.digit)
and `stop`; each carries `sequenceNumber` and, after `connected`, `streamSid`.
From Parley: `media` (streamSid, media.payload), `mark` (streamSid, mark.name) and `clear`
(streamSid).

`parse()` turns one text message into one of the dataclasses below, or raises
`BadMessage` (not JSON, not an object, a known event missing what it needs) or
`UnknownEvent`; neither is fatal to a stream.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

ENCODING = "audio/x-mulaw"
SAMPLE_RATE = 8_000
CHANNELS = 1


class BadMessage(ValueError):
    """A message that is not one Twilio sends."""


class UnknownEvent(BadMessage):
    """A well-formed message with an event Parley does not know."""


@dataclass(frozen=True, slots=True)
class Connected:
    protocol: str
    version: str


@dataclass(frozen=True, slots=True)
class Start:
    stream_sid: str
    call_sid: str
    account_sid: str
    tracks: tuple[str, ...]
    custom_parameters: dict[str, str] = field(default_factory=dict)
    encoding: str = ENCODING
    sample_rate: int = SAMPLE_RATE
    channels: int = CHANNELS

    @property
    def format_supported(self) -> bool:
        return (self.encoding, self.sample_rate, self.channels) == (
            ENCODING,
            SAMPLE_RATE,
            CHANNELS,
        )


@dataclass(frozen=True, slots=True)
class Media:
    track: str
    payload: bytes
    """mu-law bytes, decoded from base64."""
    chunk: int = 0
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class Mark:
    name: str


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str


@dataclass(frozen=True, slots=True)
class Stop:
    reason: str = "stop"


Message = Connected | Start | Media | Mark | Dtmf | Stop


def _object(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    if not isinstance(value, dict):
        raise BadMessage(f"a {body.get('event')} message needs a {key!r} object")
    return value


def _text(body: dict[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise BadMessage(f"{key!r} must be a string")
    return value


def _int(body: dict[str, Any], key: str) -> int:
    try:
        return int(body.get(key, 0))
    except (TypeError, ValueError):
        raise BadMessage(f"{key!r} must be a number") from None


def _start(body: dict[str, Any]) -> Start:
    start = _object(body, "start")
    media_format = start.get("mediaFormat") or {}
    params = start.get("customParameters") or {}
    tracks = start.get("tracks") or ["inbound"]
    if not isinstance(media_format, dict) or not isinstance(params, dict):
        raise BadMessage("start.mediaFormat and start.customParameters must be objects")
    if not isinstance(tracks, list):
        raise BadMessage("start.tracks must be a list")
    return Start(
        stream_sid=_text(start, "streamSid", body.get("streamSid")),
        call_sid=_text(start, "callSid", ""),
        account_sid=_text(start, "accountSid", ""),
        tracks=tuple(str(t) for t in tracks),
        custom_parameters={str(k): str(v) for k, v in params.items()},
        encoding=_text(media_format, "encoding", ENCODING),
        sample_rate=_int(media_format, "sampleRate") or SAMPLE_RATE,
        channels=_int(media_format, "channels") or CHANNELS,
    )


def _media(body: dict[str, Any]) -> Media:
    media = _object(body, "media")
    try:
        payload = base64.b64decode(_text(media, "payload"), validate=True)
    except binascii.Error:
        raise BadMessage("media.payload is not base64") from None
    return Media(
        track=_text(media, "track", "inbound"),
        payload=payload,
        chunk=_int(media, "chunk"),
        timestamp_ms=_int(media, "timestamp"),
    )


def parse(raw: str | bytes) -> Message:
    """One message from Twilio; BadMessage or UnknownEvent."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadMessage("not JSON") from None
    if not isinstance(body, dict):
        raise BadMessage("not a JSON object")
    match body.get("event"):
        case "connected":
            return Connected(str(body.get("protocol", "")), str(body.get("version", "")))
        case "start":
            return _start(body)
        case "media":
            return _media(body)
        case "mark":
            return Mark(_text(_object(body, "mark"), "name"))
        case "dtmf":
            return Dtmf(_text(_object(body, "dtmf"), "digit"))
        case "stop":
            return Stop()
        case event:
            raise UnknownEvent(f"unknown event {event!r}")


def media_message(stream_sid: str, mulaw: bytes) -> dict[str, Any]:
    return {
        "event": "media",
        "streamSid": stream_sid,
        "media": {"payload": base64.b64encode(mulaw).decode("ascii")},
    }


def mark_message(stream_sid: str, name: str) -> dict[str, Any]:
    return {"event": "mark", "streamSid": stream_sid, "mark": {"name": name}}


def clear_message(stream_sid: str) -> dict[str, Any]:
    return {"event": "clear", "streamSid": stream_sid}
