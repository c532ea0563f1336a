"""Sessions that arrive on their own: the serve benchmark's Poisson levels.

Synchronised rounds (N sessions asking at once, every question alike) are the easy case for
a batched graph: every prefill comes due together and every answer ends together. Callers
come one by one, ask questions of different lengths and get answers of different lengths;
so does this load, as vLLM-Omni's own perf cases do (their `random` and `random-mm` sets at
request rates, tests/perf/tests/test.json):

- each arrival is a new session (a WebSocket of its own) that asks one spoken question and
  hears its answer out, then hangs up; arrivals come at exponential gaps of mean 1 / rate;
- the rate for a level is `target / session_s` (Little's law: mean sessions = rate x mean
  time a session lasts), with `session_s` estimated beforehand (the question, the turn's
  end, first audio, the answer); the level then measures how many sessions were open on
  average while arrivals came, which is the figure that says what load it was;
- a question is 2-10 s of speech (`--question-s`), the bench's questions spoken back to
  back and cut at the drawn length;
- an answer is capped at a drawn number of tokens (`--answer-tokens`, the session's
  `max_output_tokens`); with random weights the graph's Talker speaks in proportion
  (`frames_per_token`), with a checkpoint the model's own lengths vary under the cap;
- a share of the arrivals (`--with-frames`) send camera frames while they speak (2 a second,
  224 x 224 JPEG): the mixed-modality set, reported apart from the audio-only one.

Everything drawn comes from one seeded generator per level (`--seed`), in a fixed order, so
a plan is the same on every run; a level is bounded by its count (`--arrival-requests`) and
its time (`--arrival-s`, after which no session starts; those open are heard out).
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import connect

from .omni_serve_client import RATE, Client, Request, chunks, failed_session, image_item

FRAME_SIZE = 224
CAMERA_FRAMES = 8
"""Distinct camera frames made per level (sent in turn)."""


@dataclass(frozen=True, slots=True)
class ArrivalSettings:
    requests: int
    """Arrivals per level at most."""
    max_s: float
    """No arrival starts later than this after the level began."""
    question_s: tuple[float, float]
    answer_tokens: tuple[int, int] | None
    with_frames: float
    """The share of arrivals that send camera frames (exactly, rounded)."""
    seed: int
    whole_turns: float = 0.0
    """The share of arrivals whose turns end by the client's commit (turn detection off):
    the server takes them whole, the baseline of the turns streamed while the user speaks."""


@dataclass(frozen=True, slots=True)
class Arrival:
    index: int
    at_s: float
    """When it connects, from the level's start."""
    question_s: float
    first_question: int
    """The question its speech starts with (the rest follow, back to back)."""
    answer_tokens: int | None
    with_frames: bool
    whole_turn: bool = False
    """Its turn ends by commit, taken whole (not streamed while it speaks)."""


def plan(target: int, rate: float, settings: ArrivalSettings, questions: int) -> list[Arrival]:
    """The level's arrivals: seeded by (seed, target), so one level's plan never depends on
    which other levels ran. Exactly `with_frames` of them (rounded) send camera frames,
    spread at random."""
    rng = np.random.default_rng([settings.seed, target])
    count = settings.requests
    low, high = settings.question_s
    at = np.cumsum(rng.exponential(1.0 / rate, count))
    question_s = rng.uniform(low, high, count)
    first = rng.integers(questions, size=count)
    tokens: list[int | None] = [None] * count
    if settings.answer_tokens is not None:
        least, most = settings.answer_tokens
        tokens = [int(t) for t in rng.integers(least, most + 1, size=count)]
    framed = rng.permutation(count) < round(settings.with_frames * count)
    whole = np.zeros(count, dtype=bool)
    if settings.whole_turns > 0:  # drawn last: a plan without them is what it always was
        whole = rng.permutation(count) < round(settings.whole_turns * count)
    return [
        Arrival(
            i,
            round(float(at[i]), 3),
            round(float(question_s[i]), 3),
            int(first[i]),
            tokens[i],
            bool(framed[i]),
            bool(whole[i]),
        )  # fmt: skip
        for i in range(count)
        if at[i] <= settings.max_s
    ]


def question_speech(
    questions: Sequence[npt.NDArray[np.int16]], first: int, seconds: float
) -> npt.NDArray[np.int16]:
    """The questions spoken back to back from `first`, cut at `seconds`."""
    wanted = int(seconds * RATE)
    parts: list[npt.NDArray[np.int16]] = []
    have, k = 0, first
    while have < wanted:
        part = questions[k % len(questions)]
        parts.append(part)
        have += len(part)
        k += 1
    return np.concatenate(parts)[:wanted]


def camera_frames(seed: int, count: int = CAMERA_FRAMES) -> list[str]:
    """Seeded noise pictures as the client's `input_image` items."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    items = []
    for _ in range(count):
        pixels = rng.integers(0, 255, (FRAME_SIZE, FRAME_SIZE, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG")
        items.append(image_item(buffer.getvalue()))
    return items


@dataclass
class Span:
    """One session, seconds from the level's start: connected, closed."""

    start_s: float
    end_s: float


async def run_arrivals(
    url: str,
    target: int,
    arrivals: Sequence[Arrival],
    questions: Sequence[npt.NDArray[np.int16]],
    frames: list[str],
    deadline: float | None,
) -> tuple[list[Request], list[Span]]:
    """Every arrival as a session of its own, each started at its time (none past
    `deadline`, time.monotonic()); all of them heard out."""
    began = time.monotonic()
    spans: list[Span] = []

    async def one(arrival: Arrival) -> Request | None:
        await asyncio.sleep(max(0.0, began + arrival.at_s - time.monotonic()))
        if deadline is not None and time.monotonic() > deadline:
            return None
        speech = chunks(question_speech(questions, arrival.first_question, arrival.question_s))
        request = Request(target, arrival.index, 0, False, arrival.question_s)
        request.answer_tokens = arrival.answer_tokens
        start = time.monotonic() - began
        try:
            async with connect(f"{url}/v1/realtime?model=parley", proxy=None, max_size=None) as ws:
                client = Client(ws, arrival.whole_turn, answer_tokens=arrival.answer_tokens)
                await client.setup()
                await client.ask(speech, request, frames if arrival.with_frames else None)
        except Exception as exc:  # refused, closed under it, ...: this session's error alone
            failed_session(request, exc)
        spans.append(Span(start, time.monotonic() - began))
        return request

    done = await asyncio.gather(*(one(a) for a in arrivals))
    return [r for r in done if r is not None], spans


def mean_sessions(spans: Sequence[Span], window: tuple[float, float]) -> float | None:
    """Sessions open on average over `window` (seconds from the level's start)."""
    low, high = window
    if high <= low:
        return None
    held = sum(max(0.0, min(s.end_s, high) - max(s.start_s, low)) for s in spans)
    return held / (high - low)


def level_summary(
    target: int, rate: float, session_s: float, arrivals: Sequence[Arrival], spans: list[Span]
) -> dict[str, Any]:
    """What load the level was: the rate asked, the sessions measured."""
    starts = sorted(s.start_s for s in spans)
    window = (starts[0], starts[-1]) if starts else (0.0, 0.0)
    measured = mean_sessions(spans, window)
    lengths = [s.end_s - s.start_s for s in spans]
    return {
        "target_sessions": target,
        "rate_per_s": round(rate, 4),
        "expected_session_s": round(session_s, 2),
        "arrivals_planned": len(arrivals),
        "sessions_started": len(spans),
        "mean_sessions": round(measured, 2) if measured is not None else None,
        "mean_sessions_window_s": [round(window[0], 1), round(window[1], 1)],
        "most_sessions": most_open(spans),
        "session_s_mean": round(float(np.mean(lengths)), 2) if lengths else None,
        "with_frames": sum(a.with_frames for a in arrivals),
    }


def most_open(spans: Sequence[Span]) -> int:
    """The most sessions open at one moment."""
    events = sorted([(s.start_s, 1) for s in spans] + [(s.end_s, -1) for s in spans])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most
