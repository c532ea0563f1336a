"""A session resumed on another process: two apps (two SessionManagers, as two server
processes would be) on one Redis, OpenAI Realtime clients moving from one to the other.

Each resume on the other app is timed (connect to the first replayed event) and printed;
the target is 1 s.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis
from PIL import Image
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from sessions.keys import SessionKeys
from sessions.rehydrate import MOVED_REASON
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from web.settings import Settings

KEY = "sk-test-parley-takeover"
RESUME_TARGET_S = 1.0

Event = dict[str, Any]


@pytest.fixture
def graph(tmp_path: Path) -> str:
    # Ten words of text, one every 0.1 s, and a short answer audio.
    return fake_graph_file(tmp_path, "audio_ms: 400, text_interval_s: 0.1, realtime_factor: 4.0")


@pytest.fixture
async def apps(graph: str, redis_url: str) -> AsyncIterator[tuple[ServedApp, ServedApp]]:
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=4)
    async with served_app(settings, redis_url) as a, served_app(settings, redis_url) as b:
        yield a, b


@contextlib.asynccontextmanager
async def client(app: ServedApp, query: str = "") -> AsyncIterator[RecordingClient]:
    url = f"{app.ws_url}/v1/realtime?model=parley{'&' + query if query else ''}"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with connect(url, additional_headers=headers, proxy=None) as ws:
        yield RecordingClient(ws)


def resume_query(session_id: str, token: str, last_event_id: str) -> str:
    return f"session_id={session_id}&resume_token={token}&last_event_id={last_event_id}"


async def ask(c: RecordingClient, text: str) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await c.send({"type": "conversation.item.create", "item": item})
    await c.send({"type": "response.create"})


async def opened(c: RecordingClient) -> tuple[str, str]:
    created = await c.wait_type("session.created")
    return created["session"]["id"], created["session"]["parley"]["resume_token"]


@contextlib.asynccontextmanager
async def resumed(app: ServedApp, query: str, label: str) -> AsyncIterator[RecordingClient]:
    """A resume on `app`, timed from the connect until the session answers (a
    session.update, after the replay): printed, and held to the 1 s target."""
    start = time.perf_counter()
    async with client(app, query) as c:
        await c.send({"type": "session.update", "session": {}})
        await c.wait_type("session.updated")
        took = time.perf_counter() - start
        print(f"\nresume on the other process ({label}): {took * 1000:.0f} ms")
        assert took < RESUME_TARGET_S
        c.events.pop()  # the session.updated: what is left is the replay
        yield c


async def closed_with(c: RecordingClient) -> int | None:
    with contextlib.suppress(ConnectionClosed):
        await c.read_to_the_end(10)
    return c.ws.close_code


async def answered(c: RecordingClient, text: str) -> Event:
    await ask(c, text)
    done = await c.wait_type("response.done")
    assert done["response"]["status"] == "completed", done
    return done


async def no_session_keys(redis_url: str, session_id: str) -> bool:
    redis = aioredis.Redis.from_url(redis_url)
    try:
        return not await redis.exists(*SessionKeys(session_id).all())
    finally:
        await redis.aclose()


async def test_a_dropped_session_resumes_on_the_other_process(
    apps: tuple[ServedApp, ServedApp], redis_url: str
) -> None:
    a, b = apps
    async with client(a) as first:
        session_id, token = await opened(first)
        await first.send({"type": "session.update", "session": {"instructions": "Be brief."}})
        await first.wait_type("session.updated")
        await first.append(np.zeros(24_000, dtype=np.int16))  # 1 s of silence: no turn
        await answered(first, "What is the weather like?")
        last = first.events[-1]["event_id"]
        await ask(first, "And tomorrow?")  # the answer to this one is missed
        await first.wait_type("response.done")
        first.ws.transport.abort()  # the network drops: no close frame
    local = a.manager.get(session_id)
    async with asyncio.timeout(5):
        while local.responding:
            await asyncio.sleep(0.02)

    async with resumed(b, resume_query(session_id, token, last), "dropped") as second:
        replayed = second.events
        kinds = [e["type"] for e in replayed]
        # Missed events replayed: the second question and its whole answer, nothing before.
        assert kinds[0] == "conversation.item.added"
        done = [e for e in replayed if e["type"] == "response.done"]
        assert [d["response"]["status"] for d in done] == ["completed"]
        assert "session.created" not in kinds and "error" not in kinds
        sent_before = [e["event_id"] for e in first.events]
        seen = set(sent_before[: sent_before.index(last) + 1])
        assert not seen & {e["event_id"] for e in replayed}
        # A has let go: no live session there; the session is B's, history intact.
        assert len(a.manager) == 0
        session = b.manager.get(session_id)
        assert session.config.instructions == "Be brief."  # the settings as last updated
        items = await session.history.items()
        assert [i.text for i in items][0::2] == ["What is the weather like?", "And tomorrow?"]
        assert all(i.role == "assistant" and i.text for i in items[1::2])
        # The timeline goes on where the stored audio ends (the resampler held back a bit).
        assert 900 <= session.describe()["input_audio_ms"] <= 1000
        # The conversation goes on, answered by B, with the whole history.
        await answered(second, "Thanks!")
        assert len(await session.history.items()) == 6
        await second.ws.close()
    async with asyncio.timeout(5):
        while len(b.manager):
            await asyncio.sleep(0.02)
    assert await no_session_keys(redis_url, session_id)


async def test_a_resume_mid_answer_ends_that_answer_as_incomplete_with_its_text(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    a, b = apps
    async with client(a) as first:
        session_id, token = await opened(first)
        await ask(first, "Tell me a story.")
        await first.wait_type("response.output_audio_transcript.delta")
        await first.wait_type("response.output_audio_transcript.delta")
        last = first.events[-1]["event_id"]
        heard = [
            e["delta"]
            for e in first.events
            if e["type"] == "response.output_audio_transcript.delta"
        ]
        # The client moves while A still serves it (a half-open socket, say).
        async with resumed(b, resume_query(session_id, token, last), "mid-answer") as second:
            moved = await first.wait_type("error")
            assert moved["error"]["code"] == "session_moved"
            assert await closed_with(first) == 1012
            replayed = second.events
            done = replayed[-1]
            assert done["type"] == "response.done", [e["type"] for e in replayed]
            # nobody cancelled it: the move cut it short (Parley's reason, OpenAI's none)
            assert done["response"]["status"] == "incomplete"
            assert done["response"]["status_details"]["parley"] == {"reason": MOVED_REASON}
            heard += [
                e["delta"]
                for e in replayed
                if e["type"] == "response.output_audio_transcript.delta"
            ]
            said = "".join(heard).strip()
            assert said and "Hello there, this is the fake model answering you.".startswith(said)
            output = done["response"]["output"][0]
            assert output["status"] == "incomplete", output
            assert output["content"][0]["transcript"] == said, output
            session = b.manager.get(session_id)
            items = await session.history.items()
            assert [i.text for i in items] == ["Tell me a story.", said]
            await answered(second, "Go on.")  # the next turn is answered normally
            await second.ws.close()


@pytest.mark.parametrize("how", ["dead", "silent"])
async def test_the_owner_dies_and_the_session_goes_on_elsewhere(
    apps: tuple[ServedApp, ServedApp], redis_url: str, how: str
) -> None:
    a, b = apps
    async with client(a) as first:
        session_id, token = await opened(first)
        await answered(first, "Hello?")
        last = first.events[-1]["event_id"]
        beat = a.manager.beat
        if how == "dead":  # no heartbeat: taken over at once
            await beat.stop()
        else:  # alive but it never answers: waited for at most 500 ms

            async def deaf(request: dict[str, Any]) -> None:
                await asyncio.sleep(30)

            beat._handler = deaf
        start = time.perf_counter()
        async with resumed(b, resume_query(session_id, token, last), how) as second:
            if how == "silent":
                assert time.perf_counter() - start > 0.45
            await answered(second, "Are you there?")
            items = await b.manager.get(session_id).history.items()
            assert [i.text for i in items][0::2] == ["Hello?", "Are you there?"]
            # The old owner's copy ends without touching the new owner's state.
            await a.manager.close_session(session_id)
            assert not await no_session_keys(redis_url, session_id)
            await answered(second, "Still there?")
            await second.ws.close()
    async with asyncio.timeout(5):
        while len(b.manager):
            await asyncio.sleep(0.02)
    assert await no_session_keys(redis_url, session_id)


@pytest.mark.parametrize("drain", [False, True])
async def test_a_hand_over_tells_the_client_to_reconnect_elsewhere(
    apps: tuple[ServedApp, ServedApp], drain: bool
) -> None:
    a, b = apps
    async with client(a) as first:
        session_id, token = await opened(first)
        await answered(first, "Hello?")
        if drain:
            assert await a.manager.hand_over_all() == 1
        else:
            assert await a.manager.hand_over(session_id)
        error = await first.wait_type("error")
        assert error["error"]["type"] == "server_error"
        assert error["error"]["code"] == ("server_draining" if drain else "session_moved")
        assert "resume_token" in error["error"]["message"]
        assert await closed_with(first) == 1012
    assert len(a.manager) == 0
    query = resume_query(session_id, token, error["event_id"])
    async with resumed(b, query, "hand-over") as second:
        assert second.events == []  # nothing was missed (no gap either)
        await answered(second, "Hello again?")
        items = await b.manager.get(session_id).history.items()
        assert [i.text for i in items][0::2] == ["Hello?", "Hello again?"]
        await second.ws.close()


def jpeg() -> str:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (5, 5, 5)).save(out, format="JPEG")
    return base64.b64encode(out.getvalue()).decode("ascii")


@contextlib.asynccontextmanager
async def stream(app: ServedApp) -> AsyncIterator[RecordingClient]:
    url = f"{app.ws_url}/v1/video/chat/stream"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with connect(url, additional_headers=headers, proxy=None, max_size=None) as ws:
        yield RecordingClient(ws)


async def test_a_video_chat_stream_resumes_on_the_other_process(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    a, b = apps
    async with stream(a) as first:
        await first.send({"type": "session.config", "parley": {"extras": True}})
        created = await first.wait_type("session.created")
        session_id, token = created["session_id"], created["resume_token"]
        await first.send({"type": "video.frame", "data": jpeg()})
        await first.send({"type": "video.query", "text": "What do you see?"})
        await first.wait_type("response.text.delta")
        last = first.events[-1]["event_id"]
        start = time.perf_counter()
        async with stream(b) as second:
            resume = {"session_id": session_id, "resume_token": token, "last_event_id": last}
            await second.send({"type": "session.resume", **resume})
            await second.send({"type": "ping"})
            await second.wait_type("pong")
            took = time.perf_counter() - start
            print(f"\nresume on the other process (video stream): {took * 1000:.0f} ms")
            assert took < RESUME_TARGET_S
            moved = await first.wait_type("error")
            assert moved["code"] == "session_moved"
            assert await closed_with(first) == 1012
            cut = [e for e in second.events if e["type"] == "response.text.done"]
            assert len(cut) == 1 and cut[0]["status"] == "cancelled", second.events
            seen = first.events[: [e["event_id"] for e in first.events].index(last) + 1]
            deltas = [
                e["delta"] for e in seen + second.events if e["type"] == "response.text.delta"
            ]
            assert cut[0]["text"] == "".join(deltas).strip()  # what the client got, no more
            assert cut[0]["text"] and "Hello there, this is the fake model".startswith(
                cut[0]["text"]
            )
            # The next question is answered by B over the frames kept in Redis.
            await second.send({"type": "video.query", "text": "And now?"})
            done = await second.wait_for(
                lambda e: e["type"] == "response.text.done" and e.get("status") == "completed"
            )
            assert done["text"].startswith("Hello there")
            await second.send({"type": "video.done"})
            assert await closed_with(second) == 1000
    assert len(a.manager) == len(b.manager) == 0


async def test_a_drain_mid_answer_ends_it_as_incomplete_on_the_next_process(
    apps: tuple[ServedApp, ServedApp],
) -> None:
    a, b = apps
    async with client(a) as first:
        session_id, token = await opened(first)
        await ask(first, "Tell me a story.")
        await first.wait_type("response.output_audio_transcript.delta")
        await a.manager.hand_over_all()
        error = await first.wait_type("error")
        assert error["error"]["code"] == "server_draining"
        assert await closed_with(first) == 1012
    heard = "".join(
        e["delta"] for e in first.events if e["type"] == "response.output_audio_transcript.delta"
    ).strip()
    query = resume_query(session_id, token, error["event_id"])
    async with resumed(b, query, "drain mid-answer") as second:
        (done,) = [e for e in second.events if e["type"] == "response.done"]
        assert done["response"]["status"] == "incomplete"  # the drain cut it, not the client
        assert done["response"]["output"][0]["content"][0]["transcript"] == heard
        await answered(second, "Go on.")
        await second.ws.close()
