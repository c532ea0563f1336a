"""Twilio Media Streams (`/v1/twilio/media`) end to end: a Twilio-format caller
(twilio_caller.py) against a real uvicorn server with the fake engine, speaking espeak-ng
speech as 8 kHz mu-law."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from loadtest.speech import silence, speak, trim_silence
from realtime.metrics import TransportMetrics
from realtime.slow_clients import TOO_SLOW, SlowClients
from realtime.twilio import twilio_stream
from sessions import Session, SessionManager
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.twilio_caller import RATE, TwilioCaller
from web.settings import Settings

KEY = "sk-test-parley-twilio"
ANSWER_MS = 1_500


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path, f"audio_ms: {ANSWER_MS}, realtime_factor: 4.0")
    async with served_app(Settings(pipeline=graph, api_key=KEY, max_sessions=2), redis_url) as s:
        yield s


@contextlib.asynccontextmanager
async def caller(server: ServedApp, query: str = "") -> AsyncIterator[TwilioCaller]:
    url = f"{server.ws_url}/v1/twilio/media{query}"
    async with connect(url, proxy=None) as ws:
        twilio = TwilioCaller(ws)
        try:
            yield twilio
        finally:
            await twilio.aclose()


def utterance(text: str) -> np.ndarray:
    speech = trim_silence(speak(text, rate=RATE))
    return np.concatenate([silence(300, RATE), speech, silence(900, RATE)])


def only_session(server: ServedApp) -> Session:
    sessions = server.services.manager.sessions() if server.services.manager else []
    assert len(sessions) == 1
    return sessions[0]


async def logged(session: Session, event_type: str, within_s: float = 10) -> dict[str, Any]:
    async with asyncio.timeout(within_s):
        while True:
            await session.event_log.flushed()
            found = [e for e in await session.event_log.replay() if e["type"] == event_type]
            if found:
                return found[-1]
            await asyncio.sleep(0.05)


async def test_a_spoken_turn_is_answered_with_paced_media_and_marks(server: ServedApp) -> None:
    async with caller(server) as twilio:
        await twilio.connect(token=KEY)
        await twilio.say(utterance("What is the weather like today?"))
        await twilio.wait(lambda: twilio.media_ms >= ANSWER_MS and not twilio._queue)
        session = only_session(server)
        done = await logged(session, "response.done")
        assert done["status"] == "completed"
        # The answer: all of it as 8 kHz mu-law, paced at about real time, with marks.
        assert twilio.media_ms == pytest.approx(ANSWER_MS, abs=1)
        spread = twilio.media_times[-1] - twilio.media_times[0]
        assert (ANSWER_MS - 200 - 150) / 1000 <= spread <= (ANSWER_MS + 600) / 1000
        kinds = [m["event"] for m in twilio.received]
        assert kinds[-1] == "mark" and kinds[0] == "media"
        marks = [m["mark"]["name"] for m in twilio.of("mark")]
        assert len(marks) == len(set(marks)) >= ANSWER_MS // 100
        assert not twilio.of("clear")
        # The keypad, a bad message and an unknown event: the stream goes on.
        await twilio.dtmf("7")
        await twilio.ws.send("{not json")
        await twilio.send({"event": "no.such.event", "streamSid": twilio.stream_sid})
        digit = await logged(session, "input_audio_buffer.dtmf_event_received")
        assert digit["digit"] == "7"
        await twilio.stop()
        await twilio.closed()
    assert twilio.ws.close_code == 1000
    async with asyncio.timeout(5):
        while server.services.manager and server.services.manager.sessions():
            await asyncio.sleep(0.02)


async def test_barge_in_clears_twilio_even_after_all_audio_was_sent(server: ServedApp) -> None:
    async with caller(server) as twilio:
        twilio.play_from = time.monotonic() + 30  # Twilio holds the answer in its buffer
        await twilio.connect(token=KEY)
        await twilio.say(utterance("What is the weather like today?"))
        await twilio.wait(lambda: twilio.media_ms >= ANSWER_MS)
        twilio.play_from = time.monotonic()  # everything was sent: now it plays
        await twilio.wait(lambda: twilio.played_ms >= 500)
        await twilio.say(utterance("Hold on, stop."))
        await twilio.wait(lambda: bool(twilio.clears), within_s=5)
        session = only_session(server)
        truncated = await logged(session, "conversation.item.truncated")
        played, last_echo = twilio.clears[0]
        await twilio.stop()
        await twilio.closed()
    # Cut at what the caller played, as its echoed marks said, not at what was sent.
    assert 400 <= truncated["audio_end_ms"] < ANSWER_MS
    # Near the last mark it echoed: the clear reaches it a little after the barge-in is
    # heard (more on a loaded machine), and it plays on meanwhile.
    assert 0 <= last_echo - truncated["audio_end_ms"] <= 600
    assert truncated["audio_end_ms"] <= played + 1


async def test_noise_over_the_answer_sends_no_clear(server: ServedApp) -> None:
    async with caller(server) as twilio:
        await twilio.connect(token=KEY)
        await twilio.say(utterance("What is the weather like today?"))
        await twilio.wait(lambda: twilio.played_ms >= 300)
        blip = trim_silence(speak("Hm.", rate=RATE))[: RATE * 120 // 1000]
        await twilio.say(np.concatenate([silence(100, RATE), blip, silence(700, RATE)]))
        await twilio.wait(lambda: twilio.media_ms >= ANSWER_MS and not twilio._queue)
        session = only_session(server)
        done = await logged(session, "response.done")
        heard = [e for e in await session.event_log.replay() if e["type"].endswith("started")]
        await twilio.stop()
        await twilio.closed()
    assert done["status"] == "completed"
    # The blip was heard as speech (playback paused), then judged noise: no clear.
    assert sum(e["type"] == "input_audio_buffer.speech_started" for e in heard) == 2
    assert not twilio.of("clear")
    assert twilio.played_ms == pytest.approx(ANSWER_MS, abs=1)


async def test_auth_by_query_token_or_custom_parameter(server: ServedApp) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with caller(server, "?token=wrong"):
            pass
    assert refused.value.response.status_code == 401
    async with caller(server) as twilio:  # no token anywhere: refused at `start`
        await twilio.connect(token=None)
        await twilio.closed()
    assert twilio.ws.close_code == 1008
    assert server.services.manager is not None and not server.services.manager.sessions()
    async with caller(server, f"?token={KEY}") as twilio:
        await twilio.connect(token=None)
        async with asyncio.timeout(5):
            while not server.services.manager.sessions():
                await asyncio.sleep(0.02)
        await twilio.stop()
        await twilio.closed()


async def test_a_socket_that_never_starts_is_closed(
    server: ServedApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(twilio_stream, "START_TIMEOUT_S", 0.3)
    async with caller(server) as twilio:
        await twilio.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await twilio.closed()
    assert twilio.ws.close_code == 1008


async def test_bad_messages_before_start_are_counted_not_fatal(server: ServedApp) -> None:
    async with caller(server) as twilio:
        await twilio.ws.send(json.dumps([1, 2]))
        await twilio.send({"event": "media", "media": {"payload": "!!"}})
        await twilio.send({"event": "mark"})
        await twilio.connect(token=KEY)
        async with asyncio.timeout(5):
            while server.services.manager and not server.services.manager.sessions():
                await asyncio.sleep(0.02)
        await twilio.stop()
        await twilio.closed()
    assert twilio.ws.close_code == 1000


async def test_a_caller_that_never_echoes_marks_still_ends_the_answer(
    server: ServedApp,
) -> None:
    async with caller(server) as twilio:
        twilio.echo_marks = False
        await twilio.connect(token=KEY)
        await twilio.say(utterance("What is the weather like today?"))
        await twilio.wait(lambda: twilio.media_ms >= ANSWER_MS)
        sent = time.monotonic()
        session = only_session(server)
        done = await logged(session, "response.done")
        async with asyncio.timeout(5):
            while session.state.value != "listening":
                await asyncio.sleep(0.02)
        waited = time.monotonic() - sent
        await twilio.stop()
        await twilio.closed()
    assert done["status"] == "completed"
    # Taken as played MARK_GRACE_S after its audio should have ended.
    assert 1.5 <= waited <= 3.5


class _StuckSocket:
    """A Twilio peer that stopped reading: every write, the close frame included, waits
    for room that never comes."""

    def __init__(self) -> None:
        self.closes = 0

    async def send_text(self, text: str) -> None:
        await asyncio.Event().wait()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closes += 1
        await asyncio.Event().wait()


async def test_a_peer_that_stops_reading_ends_the_stream_within_the_bound(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(twilio_stream, "FLUSH_TIMEOUT_S", 0.2)
    metrics = TransportMetrics()
    socket = _StuckSocket()
    stream = twilio_stream.TwilioStream(
        cast(WebSocket, socket),
        cast(SessionManager, None),
        lambda start: None,
        SlowClients(stall_s=0.2, metrics=metrics),
    )
    started = time.monotonic()
    assert not await stream.send({"event": "media", "streamSid": "MZ1", "media": {}})
    assert 0.2 <= time.monotonic() - started < 1.0
    assert (stream.close_reason, stream.close_code) == (TOO_SLOW, 1008)
    async with asyncio.timeout(2):
        await stream.close()  # the close frame cannot hang it either
    assert socket.closes == 1
    assert metrics.slow_clients.labels("twilio")._value.get() == 1
    assert [r.name for r in caplog.records].count("parley.realtime.slow_clients") == 1
