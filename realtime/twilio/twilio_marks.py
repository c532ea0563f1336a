"""What the caller has really played of a Twilio stream's answer, from the marks it echoes.

Twilio buffers the audio it is sent and plays it at its own pace, so "sent" is not "heard".
After each stretch of audio Parley sends a `mark`; Twilio sends the same mark back once
the audio before it has been played. The ledger keeps the marks sent and not yet echoed,
each with the milliseconds of audio it closes; an echo adds those (and those of any
earlier mark still pending) to the played position, the playback cursor the session
truncates an interrupted answer at.

`clear` drops Twilio's buffer, and Twilio then echoes the marks that were pending: their
audio was never played, so the ledger forgets them at the clear and ignores their echoes
(any unknown name is ignored). A mark whose echo was already on its way when the clear
went out is lost the same way: the cursor errs short by at most one mark's audio, never
long.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass(slots=True)
class _Mark:
    name: str
    ms: float


class MarkLedger:
    """Audio sent, marks pending, audio played; see the module docstring."""

    def __init__(self, prefix: str = "parley") -> None:
        self._prefix = prefix
        self._pending: collections.deque[_Mark] = collections.deque()
        self._names: set[str] = set()
        self._seq = 0
        self._unmarked_ms = 0.0
        self._played_ms = 0.0
        self.echoes = 0
        self.ignored_echoes = 0
        """Echoes of marks cleared, already echoed, or never sent by us."""

    @property
    def played_ms(self) -> int:
        """Milliseconds of audio the caller has played, as its echoed marks say."""
        return int(self._played_ms)

    @property
    def unmarked_ms(self) -> float:
        """Audio sent since the last mark (no mark closes it yet)."""
        return self._unmarked_ms

    @property
    def outstanding_ms(self) -> float:
        """Audio sent and not known to be played: marked and pending, or unmarked."""
        return sum(m.ms for m in self._pending) + self._unmarked_ms

    @property
    def pending_marks(self) -> int:
        return len(self._pending)

    def sent(self, ms: float) -> None:
        """`ms` of audio went out."""
        self._unmarked_ms += ms

    def mark(self) -> str | None:
        """The name of a mark closing the audio sent since the last one (None: nothing to
        close); send it right after that audio."""
        if self._unmarked_ms <= 0:
            return None
        self._seq += 1
        name = f"{self._prefix}-{self._seq}"
        self._pending.append(_Mark(name, self._unmarked_ms))
        self._names.add(name)
        self._unmarked_ms = 0.0
        return name

    def echoed(self, name: str) -> bool:
        """The caller played up to mark `name`; False if the name is not pending."""
        if name not in self._names:
            self.ignored_echoes += 1
            return False
        self.echoes += 1
        while self._pending:
            mark = self._pending.popleft()
            self._names.discard(mark.name)
            self._played_ms += mark.ms
            if mark.name == name:
                break
        return True

    def clear(self) -> None:
        """The caller's buffer was dropped: what is pending will never play."""
        self._pending.clear()
        self._names.clear()
        self._unmarked_ms = 0.0

    def assume_played(self) -> None:
        """Count everything pending as played (a caller that does not echo marks, once its
        audio must have ended)."""
        self._played_ms += self.outstanding_ms
        self.clear()
