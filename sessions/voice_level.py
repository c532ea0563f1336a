"""How loud the voice over an answer is, against the user's own: a voice across the room.

A second person speaking in the room, or a television, reaches the microphone well under
the user, who speaks into it. `interruption: "adaptive"` (overlap.py) uses that: speech
over an answer more than `FAR_VOICE_DB` quieter than the user's own turns is kept like a
backchannel, whatever its length or words (overlap_judge.py, the first rule).

The level of some speech is the 90th percentile of its 20 ms frames' RMS in dBFS (each
frame's as the turn detector's level gate measured it, `TurnDetector.level_dbfs`): its
loud frames, so that pauses and the noise between words do not pull it down. The user's
level is learnt from their turns (each committed turn moves it halfway to that turn's
level), so it follows a user who moves; until the user has spoken a turn it is unknown and
the cue is not used. A line with automatic gain control (most phones) evens levels out;
the cue then keeps nothing, and the other rules judge as before.
"""

from __future__ import annotations

from collections import deque

import numpy as np

FAR_VOICE_DB = 6.0
"""Speech this much quieter than the user's turns is a voice across the room (a second
voice in `loadtest.interruption_bench` is 10 dB under the user)."""
HELD_FRAMES = 250
"""The speech measured: its last 5 s of 20 ms frames at most."""
LEAST_FRAMES = 5
"""Fewer frames than this (100 ms) give no level."""


class VoiceLevels:
    """The level of the speech heard now, and of the user's turns."""

    def __init__(self) -> None:
        self._frames: deque[float] = deque(maxlen=HELD_FRAMES)
        self._measuring = False
        """Frames are kept only from a speech's start to its end."""
        self.user_dbfs: float | None = None
        """The user's level, learnt from their committed turns (None: no turn yet)."""

    def speech_started(self) -> None:
        """New speech: its level is measured from here."""
        self._frames.clear()
        self._measuring = True

    def speech_ended(self) -> None:
        """The speech ended: its level stays as measured (for `user_turn`)."""
        self._measuring = False

    def frame(self, level_dbfs: float) -> None:
        """The level of the frame heard now (the detector's)."""
        if self._measuring:
            self._frames.append(level_dbfs)

    def speech_dbfs(self) -> float | None:
        """The level of the speech since it started (None: too little of it yet)."""
        if len(self._frames) < LEAST_FRAMES:
            return None
        return float(np.percentile(np.fromiter(self._frames, dtype=np.float64), 90))

    def user_turn(self) -> None:
        """The speech was the user's turn: the user's level moves halfway to its level."""
        level = self.speech_dbfs()
        if level is None:
            return
        self.user_dbfs = level if self.user_dbfs is None else (self.user_dbfs + level) / 2

    def against_user_db(self) -> float | None:
        """The speech's level less the user's (negative: quieter), None if either is
        unknown."""
        level = self.speech_dbfs()
        if level is None or self.user_dbfs is None:
            return None
        return level - self.user_dbfs
