"""What the FastRTC and Pipecat bots answer: a tone as long as Parley's echo answer.

Parley's echo pipeline answers each turn with the caller's own words, with no model in the
way. The bots do no more work than that: they answer every turn with a fixed 400 -> 1400 Hz
sweep of the question's duration (REPLY_S, which the runner sets from the question it
speaks), streamed in 100 ms pieces as the echo streams its chunks. So turn and barge-in
latencies measure each framework's turn-taking and audio path, not a model, and a call
carries the same seconds of answer audio on every peer.
"""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

RATE = 24_000
PIECE_MS = 100
LOW_HZ, HIGH_HZ = 400.0, 1400.0


def reply_seconds() -> float:
    return float(os.environ.get("REPLY_S", "2.5"))


def sweep(seconds: float, rate: int = RATE) -> npt.NDArray[np.int16]:
    """A linear 400 -> 1400 Hz sweep at about -10 dBFS, faded in and out over 5 ms."""
    t = np.arange(int(seconds * rate)) / rate
    rising = (HIGH_HZ - LOW_HZ) / max(seconds, 1e-3)
    wave = np.sin(2 * np.pi * (LOW_HZ * t + rising * t * t / 2))
    fade = np.minimum(1.0, np.minimum(t, seconds - t) / 0.005)
    return (wave * fade * 10_000).astype(np.int16)


def pieces(pcm: npt.NDArray[np.int16], rate: int = RATE) -> list[npt.NDArray[np.int16]]:
    step = rate * PIECE_MS // 1000
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]
