"""A fork's configuration (realtime/live/live_fork.py): the stored session's, its history as
`input`, the overrides applied, the strict checks GPT-Live makes."""

from __future__ import annotations

import pytest

from realtime.live.live_config import LiveConfigError, parse_live_config
from realtime.live.live_fork import forked, parse_fork
from realtime.live.live_store import StoredSession

LIVE = parse_live_config(
    {
        "model": "gpt-live-1",
        "instructions": "Be brief.",
        "store": True,
        "audio": {"format": {"type": "audio/pcm", "rate": 16_000}, "output": {"voice": "marin"}},
        "delegation": {"type": "responses", "responses": {"tools": [], "tool_choice": "auto"}},
    }
)
STORED = StoredSession("sess_1", LIVE, [("user", "Hi, I am Ada."), ("assistant", "Hello Ada.")])


def test_a_websocket_fork_inherits_everything_and_starts_with_the_history() -> None:
    live = forked(STORED, parse_fork({}, webrtc=False), webrtc=False)
    assert (live.model, live.instructions, live.store, live.voice) == (
        "gpt-live-1",
        "Be brief.",
        True,
        "marin",
    )
    assert (live.format.type, live.format.rate) == ("audio/pcm", 16_000)
    assert [(i.role, i.content[0].text) for i in live.input or []] == STORED.history
    assert live.input is not None and live.input[1].content[0].type == "output_text"


def test_overrides_apply_and_a_webrtc_fork_states_no_format() -> None:
    body = {
        "store": False,
        "delegation": {"type": "responses", "acknowledgement_delay_ms": 300},
        "client": {"data_channel": {"allowed_client_events": ["session.close"]}},
    }
    live = forked(STORED, parse_fork(body, webrtc=True), webrtc=True)
    assert live.store is False and live.client is not None
    assert live.audio is not None and live.audio.format is None and live.voice == "marin"
    assert live.delegation is not None and live.delegation.acknowledgement_delay_ms == 300
    assert live.delegation.responses == {"tools": [], "tool_choice": "auto"}


@pytest.mark.parametrize(
    ("body", "webrtc", "param"),
    [
        ({"model": "gpt-live-1"}, False, "session.model"),
        ({"audio": {"format": {"type": "audio/pcm"}}}, True, "session.audio"),
        ({"client": {"data_channel": {}}}, False, "session.client"),
    ],
)
def test_what_a_fork_may_not_set_is_refused_naming_it(
    body: dict[str, object], webrtc: bool, param: str
) -> None:
    with pytest.raises(LiveConfigError) as refused:
        parse_fork(body, webrtc=webrtc)
    assert refused.value.param == param


def test_the_delegation_type_cannot_change() -> None:
    plain = StoredSession("sess_2", parse_live_config({"model": "gpt-live-1"}), [])
    with pytest.raises(LiveConfigError) as refused:
        forked(plain, parse_fork({"delegation": {"type": "responses"}}, webrtc=False), webrtc=False)
    assert refused.value.param == "session.delegation.type"
