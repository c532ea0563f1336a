"""The text of a tool turn as it streams in, turned into ToolCallDelta chunks.

A turn that calls a tool writes exactly `tool_prompt.call_text(name, arguments)` (the grammar
allows nothing else), so the reader waits for the name, then streams the arguments' JSON as it
grows. The last few characters are held back until the end, because they may be the start of
the closing `}</tool_call>` rather than arguments.
"""

from __future__ import annotations

import uuid

from ...types import ToolCallDelta
from .tool_prompt import ARGUMENTS_KEY, CALL_HEAD, CALL_OPEN, CALL_TAIL


class CallCutOff(ValueError):
    """The turn ended before its call was complete (the token budget ran out)."""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class CallReader:
    """Feeds on a call turn's text; yields the deltas of its one call."""

    def __init__(self, call_id: str | None = None) -> None:
        self.call_id = call_id or new_call_id()
        self.name = ""
        self._text = ""
        self._start = -1  # where the arguments begin in _text, once the name is known
        self._sent = 0  # characters of the arguments already sent

    @staticmethod
    def starts_call(text: str) -> bool:
        """Whether a turn's text so far is (or begins) a call rather than a spoken reply."""
        return text.startswith(CALL_OPEN) or (bool(text) and CALL_OPEN.startswith(text))

    def feed(self, text: str) -> list[ToolCallDelta]:
        self._text += text
        if self._start < 0:
            head = CALL_OPEN + CALL_HEAD
            end = self._text.find(ARGUMENTS_KEY, len(head))
            if not self._text.startswith(head) or end < 0:
                return []
            self.name = self._text[len(head) : end]
            self._start = end + len(ARGUMENTS_KEY)
        arguments = self._text[self._start :]
        ready = len(arguments) - len(CALL_TAIL)
        if ready <= self._sent:
            return []
        piece, self._sent = arguments[self._sent : ready], ready
        return [ToolCallDelta(self.call_id, self.name, piece)]

    def finish(self) -> ToolCallDelta:
        """The last delta (done=True); CallCutOff if the text is not a whole call."""
        arguments = self._text[self._start :] if self._start >= 0 else ""
        if self._start < 0 or not arguments.endswith(CALL_TAIL):
            raise CallCutOff(f"the tool call was cut off: {self._text[-80:]!r}")
        rest = arguments[self._sent : len(arguments) - len(CALL_TAIL)]
        return ToolCallDelta(self.call_id, self.name, rest, done=True)
