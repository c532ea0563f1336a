import pytest

from sessions.state import TRANSITIONS, IllegalTransition, SessionState, StateMachine


def test_transitions_are_checked_logged_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, str, str]] = []
    machine = StateMachine("sess_x", lambda old, new, why: seen.append((old, new, why)))
    caplog.set_level("INFO", logger="parley.sessions.state")
    machine.to(SessionState.USER_SPEAKING, "speech started")
    machine.to(SessionState.THINKING, "turn ended")
    with pytest.raises(IllegalTransition, match="thinking -> thinking"):
        machine.to(SessionState.THINKING, "again")
    machine.to(SessionState.SPEAKING, "first audio")
    machine.to(SessionState.CLOSED, "client")
    with pytest.raises(IllegalTransition):
        machine.to(SessionState.LISTENING, "after close")
    assert seen == [
        ("listening", "user_speaking", "speech started"),
        ("user_speaking", "thinking", "turn ended"),
        ("thinking", "speaking", "first audio"),
        ("speaking", "closed", "client"),
    ]
    assert "sess_x" in caplog.text and "first audio" in caplog.text


def test_every_live_state_can_close_and_closed_is_final() -> None:
    for state, targets in TRANSITIONS.items():
        if state is SessionState.CLOSED:
            assert not targets
        else:
            assert SessionState.CLOSED in targets
