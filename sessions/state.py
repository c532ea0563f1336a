"""The session's state machine: the legal transitions, in one table.

An illegal transition is a bug in the caller, so it raises. Every transition is logged
with the session id and the reason, and reported to a listener (which emits it as an event).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum

log = logging.getLogger("parley.sessions.state")


class SessionState(StrEnum):
    LISTENING = "listening"
    USER_SPEAKING = "user_speaking"
    THINKING = "thinking"
    SPEAKING = "speaking"
    CLOSED = "closed"


_S = SessionState
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    _S.LISTENING: frozenset({_S.USER_SPEAKING, _S.THINKING, _S.CLOSED}),
    _S.USER_SPEAKING: frozenset({_S.LISTENING, _S.THINKING, _S.CLOSED}),
    _S.THINKING: frozenset({_S.SPEAKING, _S.LISTENING, _S.USER_SPEAKING, _S.CLOSED}),
    # SPEAKING -> THINKING: a new answer starts while the last one's audio plays out.
    _S.SPEAKING: frozenset({_S.LISTENING, _S.USER_SPEAKING, _S.THINKING, _S.CLOSED}),
    _S.CLOSED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


Listener = Callable[[SessionState, SessionState, str], None]


class StateMachine:
    def __init__(self, session_id: str, listener: Listener | None = None) -> None:
        self.session_id = session_id
        self._state = SessionState.LISTENING
        self._listener = listener

    @property
    def state(self) -> SessionState:
        return self._state

    def can(self, new: SessionState) -> bool:
        return new in TRANSITIONS[self._state]

    def to(self, new: SessionState, reason: str) -> None:
        old = self._state
        if new not in TRANSITIONS[old]:
            raise IllegalTransition(
                f"session {self.session_id}: {old} -> {new} is not allowed ({reason})"
            )
        self._state = new
        log.info("session %s: %s -> %s (%s)", self.session_id, old, new, reason)
        if self._listener is not None:
            self._listener(old, new, reason)
