"""Locust users, one class per public protocol, each running its session on the process's
asyncio loop (`aio.LoopHost`) and firing its figures into Locust's stats.

A user's task is one whole session: connect, `--turns` spoken questions each waited for
(one answer in `--barge-every` interrupted), hang up; then `wait_time` of thinking. A failed
session is a Locust failure under the name `session`, with the exception as its message.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import soxr
from locust import User, between, events, task
from locust.env import Environment

from .aio import LoopHost
from .rtc_session import PROTOCOL as RTC
from .rtc_session import rtc_session
from .sip_session import PROTOCOL as SIP
from .sip_session import sip_session
from .speech_cache import cached_speech
from .stats import GENERATOR, LOOP_LAG, SESSION, Recorder
from .video_session import PROTOCOL as VIDEO
from .video_session import video_session
from .ws_session import PROTOCOL as WS
from .ws_session import Speech, ws_session

SESSION_TIMEOUT_S = 120.0


QUESTION = "What is the weather going to be like tomorrow in Boston?"
STOP = "Hold on, stop."


def _resampled(pcm: np.ndarray, rate: int) -> np.ndarray:
    return np.asarray(soxr.resample(pcm, 24_000, rate), dtype=np.int16)


def _speech() -> tuple[Speech, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Piper's speech, read when the Locust file is imported (before Locust starts its runner,
    so it never blocks a worker's heartbeats); speech_cache.py says why in a child process."""
    question, stop = cached_speech(QUESTION, STOP)
    speech = Speech(question, QUESTION, stop)
    pairs = [(_resampled(question, r), _resampled(stop, r)) for r in (16_000, 8000)]
    return speech, pairs[0], pairs[1]


class Shared:
    """What every user of this process shares: the loop, the recorder, the spoken speech."""

    host: LoopHost | None = None
    rec: Recorder | None = None
    speech, speech16, speech8 = _speech()
    """The question and the interruption at 24 kHz (WebSocket), 16 kHz (WebRTC's
    microphone, the video stream) and 8 kHz (SIP)."""
    counter = itertools.count()

    @classmethod
    def start(cls, environment: Environment) -> None:
        if cls.host is not None:
            return
        rec = Recorder(environment.events.request.fire)
        cls.rec = rec
        cls.host = LoopHost(lambda ms: rec.time(GENERATOR, LOOP_LAG, ms))


class ParleyUser(User):
    abstract = True
    wait_time = between(1.0, 3.0)
    protocol = ""

    def on_start(self) -> None:
        Shared.start(self.environment)

    def _options(self) -> Any:
        return self.environment.parsed_options

    def _run(self, make: Callable[[Recorder, Speech, int], Coroutine[Any, Any, Any]]) -> None:
        host, rec, speech = Shared.host, Shared.rec, Shared.speech
        assert host is not None and rec is not None
        turns = int(getattr(self._options(), "turns", 2))
        start = next(Shared.counter) * turns
        began = time.monotonic()
        try:
            host.run(make(rec, speech, start), SESSION_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - every failure is a Locust failure
            rec.fail(self.protocol, SESSION, (time.monotonic() - began) * 1000, error)
            return
        rec.time(self.protocol, SESSION, (time.monotonic() - began) * 1000)
        rec.count(f"{self.protocol} sessions")


class WsUser(ParleyUser):
    """OpenAI Realtime WebSocket: 24 kHz PCM appended in real time, server VAD."""

    protocol = WS

    @task
    def session(self) -> None:
        options = self._options()
        ws_base = "ws" + str(self.host).removeprefix("http")
        turns, every = int(options.turns), int(options.barge_every)
        self._run(lambda rec, speech, start: ws_session(ws_base, rec, speech, turns, every, start))


class RtcUser(ParleyUser):
    """WebRTC (aiortc), OpenAI's call flow: client_secrets, then POST /v1/realtime/calls."""

    protocol = RTC

    @task
    def session(self) -> None:
        question, stop = Shared.speech16
        base, turns, every = str(self.host), int(self._options().turns), self._every()
        self._run(lambda rec, _, start: rtc_session(base, rec, question, stop, turns, every, start))

    def _every(self) -> int:
        return int(self._options().barge_every)


class VideoUser(ParleyUser):
    """The video chat stream: camera frames, the microphone, spoken questions."""

    protocol = VIDEO

    @task
    def session(self) -> None:
        question, stop = Shared.speech16
        ws_base = "ws" + str(self.host).removeprefix("http")
        turns, every = int(self._options().turns), int(self._options().barge_every)
        self._run(
            lambda rec, speech, start: video_session(
                ws_base, rec, question, stop, turns, every, start, speech.question_text
            )
        )


class SipUser(ParleyUser):
    """SIP over UDP with mu-law RTP (needs the server's `--sip-port`, given as `--sip-port`)."""

    protocol = SIP

    @task
    def session(self) -> None:
        options = self._options()
        port, turns, every = int(options.sip_port), int(options.turns), int(options.barge_every)
        question, stop = Shared.speech8
        self._run(lambda rec, _, start: sip_session(port, rec, question, stop, turns, every, start))


def add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("Parley")
    group.add_argument("--turns", type=int, default=2, help="questions per session")
    group.add_argument("--barge-every", type=int, default=3, help="interrupt one answer in N")
    group.add_argument("--sip-port", type=int, default=5060, help="the server's SIP port")
    group.add_argument("--samples-dir", default="", help="write exact samples here at the end")


events.init_command_line_parser.add_listener(add_arguments)  # type: ignore[no-untyped-call]
