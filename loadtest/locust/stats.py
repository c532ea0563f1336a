"""The figures a load test measures: fired into Locust's stats and kept as exact samples.

Locust rounds response times above 1 s to two significant digits in its percentiles, so every
figure is also kept here, unrounded, and written to a JSON file when the process ends; the
report's percentiles come from these. Counters (frames heard, late frames, answers, errors)
sit next to the samples. Plain Python: `fire` is Locust's `events.request.fire` under Locust
and nothing in tests.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .clips import write_clips

Fire = Callable[..., None]

# Figure names (Locust's `name`; the protocol is its `request_type`).
CONNECT = "connect"
VOICE_TO_VOICE = "voice_to_voice"
PROCESSING = "processing"
BARGE_IN = "barge_in"
CHUNK_LAG = "chunk_lag"
ANSWER_GAP = "answer_gap"
LOOP_LAG = "loop_lag"
SESSION = "session"
FIGURES = (CONNECT, VOICE_TO_VOICE, PROCESSING, BARGE_IN, CHUNK_LAG, ANSWER_GAP, LOOP_LAG)
MAX_CLIPS = 4
"""Answers' audio kept per process for the quality figure."""
GENERATOR = "GEN"
"""The request type of the load generator's own figures (its event loop's lag)."""


class Recorder:
    """Samples (ms) per `"<protocol> <figure>"` and counters, fired as they come."""

    def __init__(self, fire: Fire | None = None) -> None:
        self._fire = fire
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.counters: dict[str, float] = defaultdict(float)
        self.clips: list[tuple[str, str, bytes]] = []

    def clip(self, protocol: str, text: str, audio: bytes) -> None:
        """Keep an answer's audio (PCM16, 24 kHz) and the text it should say, up to MAX_CLIPS."""
        if len(self.clips) < MAX_CLIPS and audio:
            self.clips.append((protocol, text, audio))

    def time(self, protocol: str, figure: str, ms: float, fire: bool = True) -> None:
        self.samples[f"{protocol} {figure}"].append(round(ms, 3))
        if fire:
            self._to_locust(protocol, figure, ms, None)

    def fail(self, protocol: str, figure: str, ms: float, error: BaseException) -> None:
        self.count(f"{protocol} errors")
        self._to_locust(protocol, figure, ms, error)

    def _to_locust(
        self, protocol: str, figure: str, ms: float, error: BaseException | None
    ) -> None:
        """One request event in Locust's stats (a failure when `error` is given)."""
        if self._fire is not None:
            self._fire(
                request_type=protocol,
                name=figure,
                response_time=ms,
                response_length=0,
                exception=error,
                context={},
            )

    def answer_gaps(self, protocol: str, arrivals: list[float], late_gap_s: float) -> None:
        """An answer's audio arrival times (monotonic s): its widest gap as `answer_gap`, and
        how many of its frames came over `late_gap_s` after the one before (`late_frames`)."""
        if len(arrivals) < 2:
            return
        steps = np.diff(np.asarray(arrivals))
        self.time(protocol, ANSWER_GAP, float(steps.max()) * 1000)
        self.count(f"{protocol} frames", len(arrivals))
        self.count(f"{protocol} late_frames", int((steps > late_gap_s).sum()))

    def count(self, key: str, n: float = 1) -> None:
        self.counters[key] += n

    def dump(self, directory: Path) -> Path:
        """Write this process's samples and counters as `samples-<pid>.json` in `directory`,
        and its clips (clips.py)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"samples-{os.getpid()}.json"
        path.write_text(json.dumps({"samples": self.samples, "counters": self.counters}))
        write_clips(directory, self.clips)
        return path


def merge(directory: Path) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Every process's samples and counters in `directory`, added up."""
    samples: dict[str, list[float]] = defaultdict(list)
    counters: dict[str, float] = defaultdict(float)
    for path in sorted(directory.glob("samples-*.json")):
        data: dict[str, Any] = json.loads(path.read_text())
        for key, values in data["samples"].items():
            samples[key].extend(values)
        for key, value in data["counters"].items():
            counters[key] += value
    return dict(samples), dict(counters)
