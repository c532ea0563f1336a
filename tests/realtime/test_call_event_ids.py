"""A data-channel message refused unparsed (too large, or no room in the inbox) still gets
an `error` that points at its `event_id`, as one about a malformed message does."""

from __future__ import annotations

import json

from realtime.transports.webrtc.call import EVENT_ID_SCAN_BYTES, MAX_MESSAGE_BYTES, client_event_id


def test_the_event_id_of_an_oversized_message_is_found_without_parsing_it() -> None:
    message = json.dumps(
        {"type": "session.update", "event_id": "evt_c1", "pad": "x" * MAX_MESSAGE_BYTES}
    )
    assert client_event_id(message) == "evt_c1"
    assert client_event_id(message.encode()) == "evt_c1"


def test_no_event_id_when_there_is_none_up_front() -> None:
    assert client_event_id('{"type": "response.create"}') is None
    late = json.dumps({"pad": "x" * EVENT_ID_SCAN_BYTES, "event_id": "evt_late"})
    assert client_event_id(late) is None  # the scan stays cheap for a flood
    assert client_event_id(b"\xff\xfe not json") is None
