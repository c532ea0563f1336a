"""A SIP user: a bare UDP call (loadtest.sip_probe's Probe: INVITE / ACK / BYE, mu-law RTP at
a microphone's 20 ms pace, every packet back timestamped). SIP carries no events, so the
figures come from the audio alone:

- connect: INVITE sent -> 200 OK;
- voice_to_voice: the question's last voiced sample -> the first audible packet back;
- answer_gap: per answer, the longest gap between packets (the server sends one every 20 ms,
  silence when nothing plays); gaps over the probe's `LATE_GAP_S` count as late packets
  (`SIP late_frames` of `SIP frames`);
- barge_in: the interruption's first packet -> the last audible packet while it is spoken
  (the answer to the interruption cannot start before it ends), as loadtest/sip_bench.py.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from ..sip_probe import LATE_GAP_S, Probe
from .stats import BARGE_IN, CONNECT, VOICE_TO_VOICE, Recorder

PROTOCOL = "SIP"
RATE = 8_000
PAUSE_S = 1.0
"""Silence sent after the question, so the server's VAD hears the turn end."""
BARGE_AFTER_S = 0.6
QUIET_S = 1.0


async def _quiet(probe: Probe) -> float:
    """Wait until nothing audible has arrived for QUIET_S; the last audible packet's time."""
    async with asyncio.timeout(30):
        while True:
            now = time.monotonic()
            if not probe.loud_times(since=now - QUIET_S):
                loud = probe.loud_times()
                return loud[-1] if loud else now
            await asyncio.sleep(0.05)


def _gaps(probe: Probe, start: float, end: float, rec: Recorder) -> None:
    rec.answer_gaps(PROTOCOL, [t for t in probe.arrivals if start <= t <= end], LATE_GAP_S)


async def _ask(probe: Probe, rec: Recorder, question: np.ndarray, stop: np.ndarray | None) -> None:
    pause = np.zeros(int(PAUSE_S * RATE), np.int16)
    asked = await probe.say(np.concatenate([question, pause]))
    last_voiced = asked + len(question) / RATE
    async with asyncio.timeout(20):
        await probe.hear(1, since=last_voiced)
    first = probe.loud_times(since=last_voiced)[0]
    rec.time(PROTOCOL, VOICE_TO_VOICE, (first - last_voiced) * 1000)
    if stop is not None:
        await asyncio.sleep(max(0.0, first + BARGE_AFTER_S - time.monotonic()))
        cut = await probe.say(stop)
        old = probe.loud_times(since=cut, until=cut + len(stop) / RATE)
        rec.time(PROTOCOL, BARGE_IN, ((old[-1] if old else cut) - cut) * 1000)
        rec.count(f"{PROTOCOL} barge_ins")
    end = await _quiet(probe)
    _gaps(probe, first, end, rec)
    rec.count(f"{PROTOCOL} answers")


async def sip_session(
    sip_port: int,
    rec: Recorder,
    question: np.ndarray,
    stop: np.ndarray,
    turns: int,
    barge_every: int,
    start: int,
) -> None:
    probe = Probe(("127.0.0.1", sip_port))
    began = time.monotonic()
    try:
        await probe.dial()
        rec.time(PROTOCOL, CONNECT, (time.monotonic() - began) * 1000)
        for i in range(turns):
            barge = barge_every > 0 and (start + i) % barge_every == barge_every - 1
            await _ask(probe, rec, question, stop if barge else None)
    finally:
        await probe.hang_up()
