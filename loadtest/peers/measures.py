"""The four measurements, identical for every peer (all times `time.monotonic()` here).

- connect: `n` calls one after another, after one untimed; offer ready -> connected.
- turn: one call, `n` questions; end of the question's last frame sent -> first loud
  (RMS > 300) answer frame received. It includes each server's end-of-turn detection:
  what a user waits.
- barge: one call, `n` tries: a question, 1 s into its answer "Hold on, stop."; latency =
  first frame of the interruption sent -> last loud frame of the old answer, which is the
  last loud frame before the first 300 ms without sound (every peer's next answer starts
  only after the interruption has ended and its turn detector has waited). An answer that
  was not cut short (it played for its whole length) counts as `not_interrupted`; its
  latency is then the rest of the answer, a lower bound of the real one.
- capacity: per step N, N calls loop "question, answer, 0.3 s", started over `stagger_s`;
  after `warm_s`, a `window_s` window: late outbound frames (probe.py, in the server),
  server CPU, answers. A step is ok when every call connected, late < 1 %, and every call
  got an answer in the window.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

from loadtest.peers.client import PeerCaller
from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import LOUD

QUESTION = "What is the weather going to be like tomorrow in Boston?"
STOP = "Hold on, stop."
GAP_S = 0.3


def utterance(text: str) -> npt.NDArray[np.int16]:
    return np.asarray(trim_silence(speak(text)), dtype=np.int16)


def question_seconds() -> float:
    return len(utterance(QUESTION)) / 16_000


@dataclass
class Target:
    peer: str
    http: httpx.AsyncClient
    probe: httpx.AsyncClient  # the server's probe.py endpoint

    def caller(self) -> PeerCaller:
        return PeerCaller(self.http, self.peer)

    async def stats(self, reset: bool = False) -> dict[str, Any]:
        response = await self.probe.get("/stats?reset=1" if reset else "/stats")
        return dict(response.json())


async def ask(caller: PeerCaller, pcm: npt.NDArray[np.int16]) -> float:
    """Speak `pcm` (16 kHz); returns when its last frame has gone out (that time)."""
    starts = len(caller.mic.speech_started_at)
    caller.mic.say(np.concatenate([pcm, silence(20)]))
    while len(caller.mic.speech_started_at) == starts:  # noqa: ASYNC110 (the mic has no event)
        await asyncio.sleep(0.005)
    end = caller.mic.speech_started_at[-1] + len(pcm) / 16_000
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    return end


async def connect(target: Target, n: int) -> list[float]:
    """`n` timed calls after one untimed one (every server's first call pays its warm-up:
    imports, a VAD model loaded, ...)."""
    times = []
    for i in range(n + 1):
        caller = target.caller()
        try:
            took = await caller.call()
        finally:
            await caller.close()
        if i:
            times.append(took)
        await asyncio.sleep(0.5)
    return times


async def turn(target: Target, n: int) -> list[float]:
    question = utterance(QUESTION)
    caller = target.caller()
    latencies = []
    try:
        await caller.call()
        await asyncio.sleep(1.0)
        for _ in range(n):
            end = await ask(caller, question)
            heard = await caller.wait_loud(end, within_s=10)
            if heard is None:
                raise RuntimeError(f"{target.peer}: no answer within 10 s")
            latencies.append((heard - end) * 1000)
            await caller.wait_quiet(0.8, within_s=30)
            await asyncio.sleep(0.4)
    finally:
        await caller.close()
    return latencies


def old_answer_end(heard: list[tuple[float, float]], since: float, until: float) -> float | None:
    """The last loud frame in [since, until] before the first `GAP_S` without a loud frame.

    `until` is where the old answer would have ended by itself: a peer that starts its next
    answer right as the old one ends leaves no gap between them.
    """
    last: float | None = None
    for t, level in heard:
        if t < since or level <= LOUD:
            continue
        if t > until:
            break
        if last is not None and t - last >= GAP_S:
            break
        last = t
    return last


async def barge(target: Target, n: int) -> dict[str, Any]:
    question, stop = utterance(QUESTION), utterance(STOP)
    answer_s = len(question) / 16_000
    caller = target.caller()
    latencies, not_interrupted = [], 0
    try:
        await caller.call()
        await asyncio.sleep(1.0)
        for _ in range(n):
            end = await ask(caller, question)
            started = await caller.wait_loud(end, within_s=10)
            if started is None:
                raise RuntimeError(f"{target.peer}: no answer within 10 s")
            await asyncio.sleep(max(0.0, started + 1.0 - time.monotonic()))
            sent = time.monotonic()
            await ask(caller, stop)
            await asyncio.sleep(answer_s + 1.0)  # the old answer's longest possible rest
            old_end = old_answer_end(caller.heard, sent, started + answer_s + 0.3)
            latencies.append(((old_end or sent) - sent) * 1000)
            if old_end is not None and old_end - started >= answer_s - 0.2:
                not_interrupted += 1
            await caller.wait_quiet(1.0, within_s=30)  # the answer to "Hold on, stop."
            await asyncio.sleep(0.4)
    finally:
        await caller.close()
    return {"barge_ms": latencies, "not_interrupted": not_interrupted}
