"""A duplex model that converses by a script, for tests of what the session layer makes of
a model's own turns (sessions/duplex_turns.py), which Moshi at toy size cannot show: its
random weights never fall quiet, so it never yields.

It is the real engine (pipeline/engines/moshi/duplex_engine.py: the 80 ms clock, the
streams, open / leave / full, late frames counted) with the model's frame replaced: it
listens, and `wait_frames` after the user's voice stops it answers with a tone of
`answer_frames`, then is quiet again. Talked over, it goes on (a duplex model may). The
contract tests (tests/pipeline/moshi/test_duplex_engine.py) hold it to the real one's
behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.engines.moshi.duplex_engine import MoshiDuplexEngine
from pipeline.engines.moshi.mimi_frames import FRAME_SAMPLES

HEARD_RMS = 500.0
"""A heard frame louder than this is the user speaking."""


@dataclass
class Listener:
    heard: int = 0
    """Voiced frames of the user's current utterance."""
    quiet: int = 0
    """Quiet frames since the user's voice stopped."""
    speaking: int = 0
    """Frames of the answer still to say."""
    said: int = 0


class ScriptedDuplex(MoshiDuplexEngine):
    def __init__(self, *, rows: int = 4, answer_frames: int = 10, wait_frames: int = 3) -> None:
        super().__init__(rows=rows)
        self.answer_frames, self.wait_frames = answer_frames, wait_frames
        self._listeners: dict[str, Listener] = {}
        t = np.arange(FRAME_SAMPLES) / 24_000
        self._tone = (np.sin(2 * np.pi * 330 * t) * 9000).astype(np.int16)
        self.answers = 0

    def _load(self) -> None:
        return None  # no weights: the script is the model

    def _frame(self, heard: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, int]]:
        out: dict[str, tuple[np.ndarray, int]] = {}
        for session_id, pcm in heard.items():
            state = self._listeners.setdefault(session_id, Listener())
            level = float(np.sqrt(np.mean(pcm.astype(np.float32) ** 2)))
            if level > HEARD_RMS:
                state.heard, state.quiet = state.heard + 1, 0
            elif state.heard:
                state.quiet += 1
                if state.quiet >= self.wait_frames and not state.speaking:
                    state.heard, state.speaking = 0, self.answer_frames
                    self.answers += 1
            if state.speaking:
                state.speaking -= 1
                state.said += 1
                out[session_id] = (self._tone, 1)
            else:
                out[session_id] = (np.zeros(FRAME_SAMPLES, np.int16), 0)
        for gone in set(self._listeners) - set(heard):
            if gone not in self._sessions:
                del self._listeners[gone]
        return out
