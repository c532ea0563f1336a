"""Twilio Media Streams' messages (parsed as Twilio's docs show them) and the mark ledger
that turns echoed marks into the played position."""

from __future__ import annotations

import base64
import json

import pytest

from realtime.twilio.twilio_marks import MarkLedger
from realtime.twilio.twilio_messages import (
    BadMessage,
    Connected,
    Dtmf,
    Mark,
    Media,
    Start,
    Stop,
    UnknownEvent,
    clear_message,
    mark_message,
    media_message,
    parse,
)

START = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": "AC123",
        "streamSid": "MZ18ad3ab5a668481ce02b83e7395059f0",
        "callSid": "CA123",
        "tracks": ["inbound"],
        "customParameters": {"FirstName": "Jane", "token": "sk-1"},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    },
    "streamSid": "MZ18ad3ab5a668481ce02b83e7395059f0",
}


def test_twilio_documented_messages_parse() -> None:
    connected = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    assert parse(json.dumps(connected)) == Connected("Call", "1.0.0")
    start = parse(json.dumps(START))
    assert isinstance(start, Start) and start.format_supported
    assert (start.stream_sid, start.call_sid, start.account_sid) == (
        "MZ18ad3ab5a668481ce02b83e7395059f0",
        "CA123",
        "AC123",
    )
    assert start.tracks == ("inbound",) and start.custom_parameters["token"] == "sk-1"
    payload = base64.b64encode(b"\xff" * 160).decode()
    media = {
        "event": "media",
        "sequenceNumber": "3",
        "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": payload},
        "streamSid": "MZ1",
    }
    assert parse(json.dumps(media)) == Media("inbound", b"\xff" * 160, 1, 5)
    mark = {"event": "mark", "sequenceNumber": "4", "streamSid": "MZ1", "mark": {"name": "a"}}
    assert parse(json.dumps(mark)) == Mark("a")
    dtmf = {"event": "dtmf", "streamSid": "MZ1", "dtmf": {"track": "inbound_track", "digit": "1"}}
    assert parse(json.dumps(dtmf)) == Dtmf("1")
    stop = {"event": "stop", "streamSid": "MZ1", "stop": {"accountSid": "AC1", "callSid": "CA1"}}
    assert parse(json.dumps(stop)) == Stop()


def test_a_format_other_than_mulaw_8k_mono_is_flagged() -> None:
    body = json.loads(json.dumps(START))
    body["start"]["mediaFormat"]["sampleRate"] = 16000
    start = parse(json.dumps(body))
    assert isinstance(start, Start) and not start.format_supported


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        b"\xff\xfe",
        "[1, 2]",
        '{"event": "media"}',
        '{"event": "media", "media": {"payload": "!!"}}',
        '{"event": "mark", "mark": {}}',
        '{"event": "dtmf", "dtmf": {"digit": 5}}',
        '{"event": "start", "start": {"tracks": "inbound"}}',
    ],
)
def test_bad_messages_raise_bad_message(raw: str | bytes) -> None:
    with pytest.raises(BadMessage):
        parse(raw)


def test_unknown_events_are_told_apart() -> None:
    with pytest.raises(UnknownEvent):
        parse('{"event": "hello"}')


def test_outbound_messages_are_twilios() -> None:
    assert media_message("MZ1", b"\x7f\x7f") == {
        "event": "media",
        "streamSid": "MZ1",
        "media": {"payload": "f38="},
    }
    assert mark_message("MZ1", "m") == {"event": "mark", "streamSid": "MZ1", "mark": {"name": "m"}}
    assert clear_message("MZ1") == {"event": "clear", "streamSid": "MZ1"}


def test_the_played_position_is_the_last_echoed_mark() -> None:
    ledger = MarkLedger()
    assert ledger.mark() is None  # nothing sent, nothing to mark
    ledger.sent(60)
    ledger.sent(40)
    first = ledger.mark()
    ledger.sent(100)
    second = ledger.mark()
    ledger.sent(20)  # sent, not yet marked
    assert first and second and ledger.outstanding_ms == 220 and ledger.played_ms == 0
    assert ledger.echoed(second)  # an echo covers the marks before it too
    assert ledger.played_ms == 200 and ledger.pending_marks == 0
    assert not ledger.echoed(first)  # already counted
    assert ledger.ignored_echoes == 1


def test_a_clear_forgets_pending_marks_and_their_late_echoes() -> None:
    ledger = MarkLedger()
    ledger.sent(100)
    played = ledger.mark()
    ledger.sent(100)
    dropped = ledger.mark()
    assert played and dropped and ledger.echoed(played)
    ledger.clear()  # Twilio then echoes the dropped mark: never played
    assert not ledger.echoed(dropped)
    assert ledger.played_ms == 100 and ledger.outstanding_ms == 0


def test_assume_played_counts_everything_sent() -> None:
    ledger = MarkLedger()
    ledger.sent(100)
    ledger.mark()
    ledger.sent(30)
    ledger.assume_played()
    assert ledger.played_ms == 130 and ledger.outstanding_ms == 0
