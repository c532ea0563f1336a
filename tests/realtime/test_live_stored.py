"""GPT-Live's stored sessions, end to end with the official SDK against two real uvicorn
servers on one Redis (as `parley serve --workers 2`), the fake engine behind them: a
session with `store: true` is stored on one worker; its recording downloads and its forks
(WebSocket and WebRTC) start on the other."""

from __future__ import annotations

import asyncio
import io
import time
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI
from openai.types.live import SessionConfigParam

from loadtest.webrtc_client import Caller
from realtime.live.live_store import stored_key
from tests.realtime.apps import ServedApp, two_workers
from tests.realtime.test_live_webrtc import question
from tests.realtime.test_live_ws import RATE, answer_samples, b64, recv_until, utterance

KEY = "sk-test-parley-live-stored"
STORED: SessionConfigParam = {
    "model": "gpt-live-1",
    "instructions": "You are terse.",
    "store": True,
}


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """The tests' own Redis client; the stored sessions go when the test does."""
    client = aioredis.Redis.from_url(redis_url)
    yield client
    stored = [key async for key in client.scan_iter("parley:*:live_stored")]
    if stored:
        await client.delete(*stored)
    await client.aclose()


@pytest.fixture
async def workers(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[ServedApp, ServedApp]]:
    async with two_workers(tmp_path, redis_url, KEY, "audio_ms: 2000, realtime_factor: 4.0") as w:
        yield w


def sdk(app: ServedApp, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=f"{app.http_url}/v1", max_retries=0)


async def stored_on(redis: aioredis.Redis, session_id: str) -> None:
    """The session's record is written as it ends, just after its connection closes."""
    async with asyncio.timeout(10):
        while not await redis.exists(stored_key(session_id)):
            await asyncio.sleep(0.05)


def channels(content: bytes) -> tuple[np.ndarray, np.ndarray, int]:
    with wave.open(io.BytesIO(content)) as file:
        assert (file.getnchannels(), file.getsampwidth()) == (2, 2)
        rate = file.getframerate()
        samples = np.frombuffer(file.readframes(file.getnframes()), "<i2").reshape(-1, 2)
    return samples[:, 0], samples[:, 1], rate


async def test_a_stored_session_records_both_sides_and_a_websocket_fork_continues_it(
    workers: tuple[ServedApp, ServedApp], redis: aioredis.Redis
) -> None:
    a, b = workers
    async with sdk(a) as client, client.live.connect() as conn:
        began = time.monotonic()
        await conn.session.start(session=STORED)
        started = await conn.recv()
        assert started.type == "session.started" and started.session.store is True
        session_id = started.session.id
        pcm = utterance("What is the weather like today?")
        for begin in range(0, len(pcm), RATE // 10):
            await conn.session.input_audio.append(
                audio=b64(pcm[begin : begin + RATE // 10].astype("<i2").tobytes())
            )
        async with asyncio.timeout(30):
            audio = 0
            while audio < 2 * RATE:  # the fake engine's whole 2 s answer
                audio += answer_samples(await conn.recv())
        await conn.session.close()
        await recv_until(conn, "session.closed")
        length_s = time.monotonic() - began
    await stored_on(redis, session_id)
    assert 0 < await redis.ttl(stored_key(session_id)) <= 86_400

    async with sdk(b) as client:  # the other worker: the record is in Redis
        content = (await client.live.sessions.download_recording(session_id)).content
        user, model, rate = channels(content)
        assert rate == 16_000
        assert abs(len(user) / rate - length_s) < 1.0, (len(user) / rate, length_s)
        assert np.abs(user).max() > 1000  # the question
        assert np.count_nonzero(model) > rate  # the 2 s answer

        async with client.live.forks.connect(session_id=session_id) as fork:
            await fork.session.start(session={"store": False}, event_id="f-1")
            forked = await fork.recv()
            assert forked.type == "session.started", forked
            assert forked.client_event_id == "f-1"
            assert forked.session.id != session_id
            assert forked.session.model == "gpt-live-1" and forked.session.store is False
            assert forked.session.instructions == "You are terse."
            history = [(i.role, i.content[0].text) for i in forked.session.input or []]
            assert history[0][0] == "user" and history[0][1].strip(), history
            assert history[-1][0] == "assistant" and history[-1][1].startswith("Hello there")
            primary = b.services.live_sessions.get(forked.session.id)
            assert primary is not None and primary.session is not None  # the model's context:
            items = await primary.session.history.items()
            assert [(i.role, i.text) for i in items] == history
            await fork.session.close()
            await recv_until(fork, "session.closed")
    await asyncio.sleep(0.2)  # a fork without `store` leaves nothing of its own
    assert [k async for k in redis.scan_iter("parley:*:live_stored")] == [
        stored_key(session_id).encode()
    ]


async def test_a_webrtc_fork_answers_the_offer_and_connects_with_the_history(
    workers: tuple[ServedApp, ServedApp], redis: aioredis.Redis
) -> None:
    a, b = workers
    told: SessionConfigParam = {
        **STORED,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "My name is Ada."}]}],
    }
    async with sdk(a) as client, client.live.connect() as conn:
        await conn.session.start(session=told)
        began = await conn.recv()
        assert began.type == "session.started"
        session_id = began.session.id
        await conn.session.close()
        await recv_until(conn, "session.closed")
    await stored_on(redis, session_id)

    async with httpx.AsyncClient(base_url=b.http_url) as http, sdk(b) as client:
        caller = Caller(http)
        try:
            offer = await caller.offer()
            answer = await client.live.sessions.fork(
                session_id, transport={"type": "webrtc", "sdp": offer}
            )
            assert answer.transport.type == "webrtc" and "a=fingerprint" in answer.transport.sdp
            assert answer.session.id != session_id
            await caller.answered(answer.transport.sdp)
            started = await caller.wait_for(lambda e: e["type"] == "session.started")
            assert started["session"]["id"] == answer.session.id
            assert started["session"]["input"][0]["content"][0]["text"] == "My name is Ada."
            assert started["session"]["store"] is True  # inherited
            caller.mic.say(question())
            await caller.wait_for(lambda e: e["type"] == "session.output_transcript.delta")
            await asyncio.sleep(1.0)  # some of the answer on the track
            caller.send({"type": "session.close"})
            await caller.wait_for(lambda e: e["type"] == "session.closed")
        finally:
            await caller.close()
        await stored_on(redis, answer.session.id)  # the fork is stored in its turn
        recording = await client.live.sessions.download_recording(answer.session.id)
        user, model, rate = channels(recording.content)
        assert rate == 16_000
        assert np.abs(user).max() > 1000 and np.count_nonzero(model) > rate // 2


async def test_unknown_expired_and_unauthorised_are_refused(
    workers: tuple[ServedApp, ServedApp], redis: aioredis.Redis
) -> None:
    a, _ = workers
    async with sdk(a) as client, client.live.connect() as conn:
        await conn.session.start(session=STORED)
        began = await conn.recv()
        assert began.type == "session.started"
        session_id = began.session.id
        await conn.session.close()
        await recv_until(conn, "session.closed")
    await stored_on(redis, session_id)
    async with sdk(a, "sk-wrong") as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.live.sessions.download_recording(session_id)
        with pytest.raises(openai.AuthenticationError):
            await stranger.live.sessions.fork(
                session_id, transport={"type": "webrtc", "sdp": "v=0"}
            )
    async with sdk(a) as client:
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.live.sessions.download_recording("sess_unknown")
        assert unknown.value.code == "session_not_found"
        with pytest.raises(openai.NotFoundError):
            await client.live.sessions.fork(
                "sess_unknown", transport={"type": "webrtc", "sdp": "v=0"}
            )
        with pytest.raises(Exception, match="404"):  # refused before the upgrade
            async with client.live.forks.connect(session_id="sess_unknown", max_retries=0) as fork:
                await fork.recv()
        await redis.pexpire(stored_key(session_id), 50)  # the retention runs out
        await asyncio.sleep(0.2)
        with pytest.raises(openai.NotFoundError):
            await client.live.sessions.download_recording(session_id)
