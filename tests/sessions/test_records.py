"""Event records read back from the event log are the events that were logged."""

from __future__ import annotations

import json

import pytest

from sessions.events import Event
from sessions.records import event_from_dict, event_to_dict
from tests.realtime.test_server_events import samples


@pytest.mark.parametrize("event", samples(), ids=lambda e: e.type)
def test_every_event_survives_the_round_trip_through_json(event: Event) -> None:
    body = json.loads(json.dumps(event_to_dict(event)))
    back = event_from_dict(body)
    assert type(back) is type(event)
    assert back == event


def test_an_unknown_type_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        event_from_dict({"type": "from.the.future", "event_id": "evt_1"})
